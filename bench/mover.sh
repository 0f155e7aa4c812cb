#!/bin/sh
# Benchmarks the data mover (bin/kip-mover) against the method other tools' copy pods use,
# side by side in one run on the same filesystem, with the page cache dropped before each phase:
#   kip-mover copy SRC DST (its syncfs included)     then  kip-mover verify SRC DST
#   rsync -aHAXS SRC/ DST/ && sync                    then  rsync -aHAXS -c --dry-run --itemize-changes SRC/ DST/
# on two data sets: (a) 2 GiB in 64 files of 32 MiB of random data, (b) 150,000 files of 4 KiB in
# nested directories (150 directories x 10 subdirectories x 100 files). Each phase is timed: wall
# seconds, CPU seconds (user + system of the command and its children), MB/s (10^6 bytes per
# second of the data set's bytes) and files per second. It also measures the disk's own sequential
# write and read speed on the same filesystem with dd and fio, and checks the goals: copy + verify
# at least 2x faster than the rsync pair on each set, and at most 0.15 ms per file on (b).
#
# Usage (as root, for drop_caches; installs rsync and fio with apt-get when missing):
#   sudo sh bench/mover.sh
# Environment:
#   BENCH_DIR        work directory, on the filesystem to measure (default /var/tmp/kip-bench-mover)
#   BENCH_OUT        where the results go (default $BENCH_DIR/results/DATE-TIME): report.txt (the
#                    table), results.tsv (one row per phase), summary.tsv (ratios and goals), logs
#   BENCH_A_FILES    files in (a) (64)          BENCH_A_MIB_EACH  MiB per file in (a) (32)
#   BENCH_B_FILES    files in (b) (150000)      BENCH_B_KIB_EACH  KiB per file in (b) (4)
#   BENCH_DISK_MIB   MiB written and read by dd and fio (default: the size of (a))
#   BENCH_WORKERS    passed to kip-mover as --workers N (default: kip-mover's own)
#   BENCH_REGEN=1    generate the data sets again (they are kept between runs otherwise)
#   BENCH_CLEAN=1    remove $BENCH_DIR (data sets, copies and results) and exit
# A quick smoke run: sudo BENCH_A_FILES=4 BENCH_A_MIB_EACH=8 BENCH_B_FILES=2000 sh bench/mover.sh
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
work=${BENCH_DIR:-/var/tmp/kip-bench-mover}
a_files=${BENCH_A_FILES:-64}
a_mib=${BENCH_A_MIB_EACH:-32}
b_files=${BENCH_B_FILES:-150000}
b_kib=${BENCH_B_KIB_EACH:-4}
disk_mib=${BENCH_DISK_MIB:-}
workers=${BENCH_WORKERS:-}
mover=$root/bin/kip-mover

die() {
	echo "bench/mover.sh: $*" >&2
	exit 1
}
note() { echo "== $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "run as root (the page cache is dropped before each phase): sudo sh bench/mover.sh"
for v in "$a_files" "$a_mib" "$b_files" "$b_kib" ${disk_mib:+"$disk_mib"} ${workers:+"$workers"}; do
	case "$v" in
	'' | *[!0-9]* | 0*) die "sizes and BENCH_WORKERS must be positive integers, not '$v'" ;;
	esac
done
[ -n "$disk_mib" ] || disk_mib=$((a_files * a_mib))
case "$work" in
/*) ;;
*) die "BENCH_DIR must be an absolute path, not '$work'" ;;
esac
[ "$work" != / ] || die "BENCH_DIR must not be /"

if [ "${BENCH_CLEAN:-}" = 1 ]; then
	note "removing $work"
	rm -rf -- "$work"
	exit 0
fi

# need CMD PACKAGE: installs PACKAGE with apt-get when CMD is missing; fails when it cannot.
need() {
	command -v "$1" >/dev/null 2>&1 && return 0
	note "$1 is missing: installing the Debian package $2 (apt-get install -y $2)"
	command -v apt-get >/dev/null 2>&1 || die "$1 is missing and there is no apt-get to install $2"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y "$2" >&2; then
		apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y "$2" >&2 || die "could not install $2"
	fi
	command -v "$1" >/dev/null 2>&1 || die "$1 is still missing after installing $2"
}
need python3 python3
need rsync rsync
have_fio=1
if ! command -v fio >/dev/null 2>&1; then
	( need fio fio ) || { have_fio=0; note "no fio: the disk is measured with dd only"; }
fi

if command -v go >/dev/null 2>&1; then
	note "building bin/kip-mover"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -o bin/kip-mover ./cmd/kip-mover) || die "go build ./cmd/kip-mover failed"
elif [ -x "$mover" ]; then
	note "no go on PATH: using the existing $mover"
else
	die "no $mover and no go to build it (cd $root && CGO_ENABLED=0 go build -trimpath -o bin/kip-mover ./cmd/kip-mover)"
fi

data=$work/data
copy=$work/copy
out=${BENCH_OUT:-$work/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$data" "$out"
if [ -e "$copy" ] || [ -e "$work/disk.dat" ]; then
	rm -rf -- "$copy" "$work/disk.dat"
	# ext4 skips inodes freed in the last 30 seconds when it allocates new ones (find_inode_bit,
	# recently_deleted), which slows the next copy down for whoever comes first: wait it out.
	# For the same reason no copy is deleted until the run ends.
	sync
	note "waiting 35 s for ext4 to stop avoiding the inodes just freed"
	sleep 35
fi
mkdir -p "$copy"
results=$out/results.tsv
summary=$out/summary.tsv
report=$out/report.txt

# Room: both data sets, a copy of the larger, the disk test's file, with a margin for metadata.
a_bytes=$((a_files * a_mib * 1048576))
b_alloc=$(((b_files * ((b_kib + 3) / 4 * 4 + 1) + b_files / 100 * 8) * 1024))
need_kib=$(((a_bytes * 2 + b_alloc * 2 + disk_mib * 1048576) / 1024 * 11 / 10))
free_kib=$(df -Pk "$work" | awk 'NR == 2 { print $4 }')
free_inodes=$(df -Pi "$work" | awk 'NR == 2 { print $4 }')
[ -d "$data/a" ] && need_kib=$((need_kib - a_bytes / 1024))
[ -d "$data/b" ] && need_kib=$((need_kib - b_alloc / 1024))
[ "$free_kib" -ge "$need_kib" ] || die "$work has $((free_kib / 1024)) MiB free, the run needs about $((need_kib / 1024)) MiB"
case "$free_inodes" in
'' | *[!0-9]*) ;; # filesystems without inode counts (btrfs) show "-"
*) [ "$free_inodes" -ge $((b_files * 2 + b_files / 50 + 1000)) ] || die "$work has $free_inodes free inodes, the run needs about $((b_files * 2))" ;;
esac

# drop: flushes everything and drops the page cache, dentries and inodes.
drop() {
	sync
	echo 3 >/proc/sys/vm/drop_caches || die "cannot write /proc/sys/vm/drop_caches"
}

# timed NAME CMD...: runs CMD with its stdout in $out/NAME.out and its stderr in $out/NAME.err, and
# sets wall, user, sys (seconds) and rc. The timer is python3, which reports the wall time and the
# CPU time of the command and all its children (getrusage RUSAGE_CHILDREN), to the microsecond.
timer='
import os, resource, subprocess, sys, time
res, so, se, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with open(so, "wb") as o, open(se, "wb") as e:
    t0 = time.monotonic()
    rc = subprocess.call(cmd, stdout=o, stderr=e)
    wall = time.monotonic() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
rc = rc if rc >= 0 else 128 - rc
with open(res, "w") as f:
    f.write("%.6f %.6f %.6f %d\n" % (wall, r.ru_utime, r.ru_stime, rc))
'
timed() {
	name=$1
	shift
	python3 -c "$timer" "$out/$name.time" "$out/$name.out" "$out/$name.err" "$@" || true
	read -r wall user sys rc <"$out/$name.time" || die "$name: no timing"
}

# jget FILE KEY...: the value at KEY... in the JSON line in FILE (its last line).
jget() {
	python3 -c '
import json, sys
try:
    v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    v = ""  # no report: the callers fail on the empty value
for k in sys.argv[2:]:
    v = v.get(k, "") if isinstance(v, dict) else ""
print(v)
' "$@"
}

# row SET TOOL PHASE SECONDS USER SYS BYTES FILES: appends a row to results.tsv.
row() {
	awk -v OFS='\t' -v s="$1" -v t="$2" -v p="$3" -v w="$4" -v u="$5" -v y="$6" -v b="$7" -v f="$8" 'BEGIN {
		print s, t, p, sprintf("%.3f", w), sprintf("%.3f", u + y), sprintf("%.3f", u), sprintf("%.3f", y), b, f,
			(w > 0 && b > 0 ? sprintf("%.1f", b / w / 1e6) : ""), (w > 0 && f > 0 ? sprintf("%.0f", f / w) : "")
	}' >>"$results"
}
printf 'set\ttool\tphase\tseconds\tcpu_seconds\tuser_seconds\tsys_seconds\tbytes\tfiles\tmb_per_s\tfiles_per_s\n' >"$results"
printf 'key\tvalue\n' >"$summary"
sum() { printf '%s\t%s\n' "$1" "$2" >>"$summary"; }

set -- # the --workers option, when given, is "$@" from here on
[ -n "$workers" ] && set -- --workers "$workers"

# generate SET: makes the data set SET (a or b) in $data/SET unless it is there with these sizes.
generate() {
	case $1 in
	a) stamp="files=$a_files mib=$a_mib" ;;
	b) stamp="files=$b_files kib=$b_kib" ;;
	esac
	if [ "${BENCH_REGEN:-}" != 1 ] && [ -d "$data/$1" ] && [ "$(cat "$data/$1.stamp" 2>/dev/null)" = "$stamp" ]; then
		note "data set ($1) is there ($stamp): $data/$1"
		return
	fi
	rm -rf -- "$data/$1" "$data/$1.stamp"
	mkdir -p "$data/$1"
	note "generating data set ($1): $stamp in $data/$1"
	case $1 in
	a)
		i=0
		while [ $i -lt "$a_files" ]; do
			head -c $((a_mib * 1048576)) /dev/urandom >"$data/a/f$(printf %04d $i)"
			i=$((i + 1))
		done
		;;
	b)
		python3 -c '
import os, sys
top, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) * 1024
for i in range(n):
    d = os.path.join(top, "d%04d" % (i // 1000), "s%d" % (i // 100 % 10))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%02d" % (i % 100)), "wb") as f:
        f.write(os.urandom(size))
' "$data/b" "$b_files" "$b_kib"
		;;
	esac
	sync
	echo "$stamp" >"$data/$1.stamp"
}

# bench SET [--workers N]: the four phases on data set SET; sets files_SET, bytes_SET, speedup_SET.
bench() {
	s=$1
	shift
	src=$data/$s
	"$mover" scan --termination-log /nonexistent "$src" >"$out/$s-scan.out" 2>"$out/$s-scan.err" || die "kip-mover scan $src failed: $(cat "$out/$s-scan.err")"
	files=$(jget "$out/$s-scan.out" totals files)
	bytes=$(jget "$out/$s-scan.out" totals bytes)
	eval "files_$s=\$files bytes_$s=\$bytes"

	note "($s) kip-mover copy"
	kcopy=$copy/$s-kip-mover rcopy=$copy/$s-rsync
	mkdir "$kcopy" "$rcopy"
	drop
	timed "$s-kip-copy" "$mover" copy --termination-log /nonexistent "$@" "$src" "$kcopy"
	[ "$rc" -eq 0 ] && [ "$(jget "$out/$s-kip-copy.out" result)" = done ] ||
		die "($s) kip-mover copy failed (exit $rc): $(cat "$out/$s-kip-copy.err")"
	[ "$(jget "$out/$s-kip-copy.out" totals files)" = "$files" ] && [ "$(jget "$out/$s-kip-copy.out" totals bytes)" = "$bytes" ] ||
		die "($s) kip-mover copy's totals differ from the scan's ($files files, $bytes bytes): $(cat "$out/$s-kip-copy.out")"
	row "$s" kip-mover copy "$wall" "$user" "$sys" "$bytes" "$files"
	kc=$wall kcu=$user kcs=$sys
	sum "$s.kip-mover.copy.reported_seconds" "$(jget "$out/$s-kip-copy.out" seconds)"
	sum "$s.kip-mover.copy.sync_seconds" "$(jget "$out/$s-kip-copy.out" syncSeconds)"
	sum "$s.kip-mover.workers" "$(jget "$out/$s-kip-copy.out" workers)"

	note "($s) kip-mover verify"
	drop
	timed "$s-kip-verify" "$mover" verify --termination-log /nonexistent "$@" "$src" "$kcopy"
	result=$(jget "$out/$s-kip-verify.out" result)
	if [ "$rc" -ne 0 ] || [ "$result" != done ]; then
		cat "$out/$s-kip-verify.err" >&2
		die "($s) kip-mover verify did not find the copy the same: exit $rc, result '$result' (want 0, done); see $out/$s-kip-verify.out"
	fi
	[ "$(jget "$out/$s-kip-verify.out" totals files)" = "$files" ] ||
		die "($s) kip-mover verify compared $(jget "$out/$s-kip-verify.out" totals files) files, the scan counted $files"
	row "$s" kip-mover verify "$wall" "$user" "$sys" "$bytes" "$files"
	sum "$s.kip-mover.verify.reported_seconds" "$(jget "$out/$s-kip-verify.out" seconds)"
	kv=$wall kvu=$user kvs=$sys

	note "($s) rsync -aHAXS copy + sync"
	drop
	timed "$s-rsync-copy" sh -c 'rsync -aHAXS "$1/" "$2/" && sync' sh "$src" "$rcopy"
	[ "$rc" -eq 0 ] || die "($s) rsync copy failed (exit $rc): $(cat "$out/$s-rsync-copy.err")"
	row "$s" rsync copy "$wall" "$user" "$sys" "$bytes" "$files"
	rc_=$wall rcu=$user rcs=$sys

	note "($s) rsync -c --dry-run verify"
	drop
	timed "$s-rsync-verify" rsync -aHAXS -c --dry-run --itemize-changes "$src/" "$rcopy/"
	[ "$rc" -eq 0 ] || die "($s) rsync verify failed (exit $rc): $(cat "$out/$s-rsync-verify.err")"
	[ ! -s "$out/$s-rsync-verify.out" ] ||
		die "($s) rsync's verify itemized changes, the rsync copy is not complete: $(head -n 5 "$out/$s-rsync-verify.out")"
	row "$s" rsync verify "$wall" "$user" "$sys" "$bytes" "$files"
	rv=$wall rvu=$user rvs=$sys

	sync

	add() { echo "$1 $2" | awk '{ printf "%.6f", $1 + $2 }'; }
	k_total=$(add "$kc" "$kv")
	r_total=$(add "$rc_" "$rv")
	row "$s" kip-mover copy+verify "$k_total" "$(add "$kcu" "$kvu")" "$(add "$kcs" "$kvs")" "$bytes" "$files"
	row "$s" rsync copy+verify "$r_total" "$(add "$rcu" "$rvu")" "$(add "$rcs" "$rvs")" "$bytes" "$files"
	speedup=$(echo "$r_total $k_total" | awk '{ printf "%.2f", $1 / $2 }')
	sum "$s.speedup" "$speedup"
	sum "$s.goal_2x" "$(echo "$speedup" | awk '{ print ($1 >= 2 ? "met" : "not met") }')"
	eval "speedup_$s=\$speedup"
}

# disk: sequential write and read of $disk_mib MiB on the same filesystem, with dd and fio.
disk() {
	f=$work/disk.dat
	n=$((disk_mib * 1048576))
	note "disk: dd write, $disk_mib MiB"
	rm -f -- "$f"
	drop
	timed disk-dd-write dd if=/dev/zero of="$f" bs=1M count="$disk_mib" oflag=direct conv=fdatasync
	[ "$rc" -eq 0 ] || die "dd write failed: $(cat "$out/disk-dd-write.err")"
	row disk dd write "$wall" "$user" "$sys" "$n" 0
	note "disk: dd read, $disk_mib MiB"
	drop
	timed disk-dd-read dd if="$f" of=/dev/null bs=1M
	[ "$rc" -eq 0 ] || die "dd read failed: $(cat "$out/disk-dd-read.err")"
	row disk dd read "$wall" "$user" "$sys" "$n" 0
	rm -f -- "$f"
	[ "$have_fio" = 1 ] || return 0
	engine=libaio
	for rw in write read; do
		note "disk: fio sequential $rw, 1 MiB blocks, direct, queue depth 16, $disk_mib MiB"
		drop
		fio_run() {
			timed "disk-fio-$rw" fio --name="seq$rw" --filename="$f" --rw="$rw" --bs=1M --size="${disk_mib}M" \
				--direct=1 --ioengine="$engine" --iodepth=16 --end_fsync=1 --output-format=json
		}
		fio_run
		if [ "$rc" -ne 0 ] && [ "$engine" = libaio ]; then
			engine=psync
			fio_run
		fi
		[ "$rc" -eq 0 ] || die "fio $rw failed: $(cat "$out/disk-fio-$rw.err")"
		bw=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
print(j["io_bytes"] / (j["runtime"] / 1000.0) if j["runtime"] else 0)
' "$out/disk-fio-$rw.out" "$rw")
		# fio's own bandwidth (its runtime, without its start and the file's layout) as the speed
		w=$(echo "$n $bw" | awk '{ print ($2 > 0 ? $1 / $2 : 0) }')
		row disk fio "$rw" "$w" "$user" "$sys" "$n" 0
	done
	sum disk.fio.ioengine "$engine"
	rm -f -- "$f"
}

{
	echo "kip-mover benchmark, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "host: $(uname -n), $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) memory"
	echo "filesystem: $(df -PT "$work" | awk 'NR == 2 { print $1 " (" $2 ") on " $7 }')"
	echo "kip-mover: $mover $(cd "$root" && git describe --always --dirty 2>/dev/null || true)${workers:+, --workers $workers}"
	echo "rsync: $(rsync --version | head -n 1)"
	echo "data sets: (a) $a_files files x $a_mib MiB, (b) $b_files files x $b_kib KiB; disk test $disk_mib MiB"
} >"$report"
cat "$report" >&2

generate a
generate b
bench a "$@"
bench b "$@"
disk

# The report: a table of results.tsv, then the comparisons.
{
	echo
	awk -F '\t' 'NR == 1 {
		printf "%-5s %-10s %-12s %10s %10s %10s %12s\n", "set", "tool", "phase", "seconds", "cpu s", "MB/s", "files/s"
		next
	}
	{ printf "%-5s %-10s %-12s %10s %10s %10s %12s\n", $1, $2, $3, $4, $5, $10, $11 }' "$results"
	echo
	tsv=$results
	val() { awk -F '\t' -v s="$1" -v t="$2" -v p="$3" -v c="$4" '$1 == s && $2 == t && $3 == p { print $c }' "$tsv"; }
	for s in a b; do
		k=$(val "$s" kip-mover copy+verify 4)
		r=$(val "$s" rsync copy+verify 4)
		eval "sp=\$speedup_$s"
		echo "($s) copy + verify: kip-mover $k s, rsync $r s: kip-mover is ${sp}x as fast;" \
			"goal >= 2x: $(echo "$sp" | awk '{ print ($1 >= 2 ? "met" : "NOT met") }')"
	done
	ms=$(echo "$(val b kip-mover copy+verify 4) $files_b" | awk '{ printf "%.4f", $1 * 1000 / $2 }')
	sum b.kip-mover.ms_per_file "$ms"
	sum b.goal_ms_per_file "$(echo "$ms" | awk '{ print ($1 <= 0.15 ? "met" : "not met") }')"
	echo "(b) kip-mover copy + verify: $ms ms per file; goal <= 0.15 ms: $(echo "$ms" | awk '{ print ($1 <= 0.15 ? "met" : "NOT met") }')"
	echo
	ac=$(val a kip-mover copy 10)
	av=$(val a kip-mover verify 10)
	for t in dd fio; do
		w=$(val disk "$t" write 10)
		rd=$(val disk "$t" read 10)
		[ -n "$w" ] || continue
		echo "disk ($t): write $w MB/s, read $rd MB/s"
		echo "$ac $av $w $rd" | awk -v t="$t" '{
			both = $3 * $4 / ($3 + $4)
			printf "  (a) kip-mover copy   %s MB/s = %.2f of the write speed, %.2f of read-and-write on one disk (%.0f MB/s)\n", $1, $1 / $3, $1 / both, both
			printf "  (a) kip-mover verify %s MB/s = %.2f of the read speed (it reads both trees: at most 0.50)\n", $2, $2 / $4
		}'
		sum "a.copy_over_$t.write" "$(echo "$ac $w" | awk '{ printf "%.3f", $1 / $2 }')"
		sum "a.copy_over_$t.read_and_write" "$(echo "$ac $w $rd" | awk '{ printf "%.3f", $1 / ($2 * $3 / ($2 + $3)) }')"
		sum "a.verify_over_$t.read" "$(echo "$av $rd" | awk '{ printf "%.3f", $1 / $2 }')"
	done
	echo
	echo "MB = 10^6 bytes; CPU = user + system seconds of the command and its children (not the kernel's"
	echo "writeback threads); copy phases include the flush (kip-mover's syncfs, rsync's sync)."
	echo "results: $out (results.tsv, summary.tsv, report.txt, each phase's output)"
} >>"$report"
cat "$report"

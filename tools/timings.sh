#!/bin/sh
# timings.sh begin FILE: starts a run's record of where its time goes in FILE: the machine's load
# and what its caches held at the start.
# timings.sh print FILE: prints the table of the run's phases (tools/phase.sh appends them: each
# build, each test command and each test package) with what each found cached, and the load now.
set -eu
mode=$1
file=$2
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}

cpu() { # cpu: the CPU time spent busy and in all since boot, in ticks (/proc/stat)
	awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 "\t" $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}

size() { # size DIR: DIR's size, or "empty"
	if [ -d "$1" ] && [ -n "$(ls -A "$1" 2>/dev/null)" ]; then
		du -sh "$1" 2>/dev/null | cut -f1
	else
		echo empty
	fi
}

case $mode in
begin)
	mkdir -p "$(dirname "$file")"
	{
		printf '#start\t%s\n' "$(date +%s)"
		printf '#load\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
		printf '#cpu\t%s\n' "$(cpu)"
		printf '#caches\tGo module cache %s, Go build cache %s, kip cache (%s) %s\n' \
			"$(size "$(go env GOMODCACHE)")" "$(size "$(go env GOCACHE)")" "$cache_root" "$(size "$cache_root")"
	} >"$file"
	;;
print)
	[ -f "$file" ] || exit 0
	now=$(date +%s)
	awk -F '\t' -v now="$now" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" -v cpu="$(cpu)" -v cores="$(nproc)" '
	function clock(ms,   s) { s = int(ms / 1000 + 0.5); return sprintf("%d:%02d", int(s / 60), s % 60) }
	$1 == "#start" { start = $2; next }
	$1 == "#load" { startload = $2; next }
	$1 == "#caches" { caches = $2; next }
	$1 == "#cpu" { busy0 = $2; total0 = $3; next }
	{ name[++n] = $1; ms[n] = $2; note[n] = $3 }
	END {
		print ""
		print "Where the time went:"
		if (caches != "") print "  at the start: " caches
		if (startload != "") print "  load average (1, 5, 15 min) at the start: " startload "; at the end: " load
		split(cpu, c, "\t")
		if (total0 != "" && c[2] > total0) printf "  CPU busy: %d%% of %d cores over the run\n", 100 * (c[1] - busy0) / (c[2] - total0), cores
		printf "  %-58s %7s  %s\n", "phase", "took", "cached / done"
		for (i = 1; i <= n; i++) printf "  %-58s %7s  %s\n", name[i], clock(ms[i]), note[i]
		if (start != "") printf "  %-58s %7s\n", "the whole run", clock((now - start) * 1000)
	}' "$file"
	;;
*)
	echo "usage: timings.sh begin|print FILE" >&2
	exit 2
	;;
esac

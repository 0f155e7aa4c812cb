# Host preparation, one subcommand per round trip (see prep.go):
#   prep.sh show FILE... [-- KEY...]
#       prints each FILE that exists and, for each sysctl KEY, whether the host can set it
#       (writable, readonly, missing) and its value
#   prep.sh modules FILE CONTENT MODULE...
#       loads each MODULE, then, if all loaded, writes CONTENT to FILE
#   prep.sh sysctls FILE CONTENT [KEY VALUE exact|atleast]...
#       writes FILE, then sets each KEY the host can set that is not at VALUE (or above it)
#   prep.sh hardening [journald|multipath FILE CONTENT]...
#       writes each FILE and has its service read it again
# Output is in sections, each starting with a line "@@kip-prep NAME" preceded by a newline.
set -eu
PATH=$PATH:/usr/sbin:/sbin
umask 022

section() { printf '\n@@kip-prep %s\n' "$1"; }

# put FILE CONTENT writes CONTENT to FILE atomically; it fails when FILE holds CONTENT already.
put() {
	if [ -f "$1" ] && [ "$(cat "$1" && echo .)" = "$2." ]; then
		return 1
	fi
	mkdir -p "$(dirname "$1")"
	printf '%s' "$2" >"$1.kip-tmp"
	mv -f "$1.kip-tmp" "$1"
}

# proc KEY prints the file of sysctl KEY.
proc() { printf '/proc/sys/%s' "$1" | tr . /; }

show() {
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		if [ -f "$1" ]; then
			section "file $1"
			cat "$1"
		fi
		shift
	done
	if [ $# -gt 0 ]; then
		shift
	fi
	for key in "$@"; do
		p=$(proc "$key")
		section "sysctl $key"
		if [ ! -e "$p" ]; then
			echo missing
		elif [ -w "$p" ]; then
			echo "writable $(cat "$p")"
		else
			echo "readonly $(cat "$p")"
		fi
	done
}

modules() {
	file=$1 content=$2
	shift 2
	failed=
	for m in "$@"; do
		# Loaded, or built in (with parameters): nothing to load. modprobe would say the same
		# where it can read /lib/modules, which a container may lack.
		if [ -d "/sys/module/$m" ]; then
			continue
		fi
		if ! out=$(modprobe "$m" 2>&1); then
			section "failed $m"
			printf '%s\n' "$out"
			failed=1
		fi
	done
	section kernel
	uname -r
	if [ -z "$failed" ]; then
		put "$file" "$content" || true
	fi
}

sysctls() {
	put "$1" "$2" || true
	shift 2
	while [ $# -ge 3 ]; do
		key=$1 value=$2 mode=$3
		shift 3
		p=$(proc "$key")
		if [ ! -e "$p" ]; then
			section "missing $key"
			continue
		fi
		current=$(cat "$p")
		if [ "$current" = "$value" ] || { [ "$mode" = atleast ] && [ "$current" -ge "$value" ]; }; then
			continue
		fi
		# A read-only key belongs to the kernel of the machine that runs this host as a
		# container: it is left as it is (prep.go says why).
		if [ -w "$p" ]; then
			printf '%s\n' "$value" >"$p"
		fi
	done
}

hardening() {
	while [ $# -ge 3 ]; do
		what=$1 file=$2 content=$3
		shift 3
		if ! put "$file" "$content"; then
			continue
		fi
		case $what in
		journald)
			systemctl restart systemd-journald
			;;
		multipath)
			if systemctl is-active --quiet multipathd; then
				multipathd reconfigure >/dev/null
			fi
			;;
		esac
	done
}

cmd=$1
shift
case $cmd in
show | modules | sysctls | hardening) "$cmd" "$@" ;;
*)
	echo "prep.sh: unknown subcommand $cmd" >&2
	exit 2
	;;
esac

# Prints what kip status and kip doctor read on a host, in sections. Each section starts with a
# line "@@kip-host NAME" preceded by a newline, so that a file without a final newline cannot
# swallow the next header. Each argument asks for sections:
#   clock          the host's clock, as seconds since the epoch (with nanoseconds where date has %N)
#   certs=DIR      one section "cert PATH" per DIR/*.crt, holding the file
#   volumes=DIR    one section "volumes": du -sk of each directory in DIR (a volume each)
#   unit=NAME      a section "unit NAME", systemd's state of NAME.service (systemctl show, or
#                  systemctl's complaint where systemd does not run), then a section
#                  "journal NAME", its last journal lines
# A missing directory prints nothing for it: kip reports what it cannot see.
set -eu
PATH=$PATH:/usr/sbin:/sbin

section() { printf '\n@@kip-host %s\n' "$1"; }

for want in "$@"; do
	case $want in
	clock)
		section clock
		date -u +%s.%N
		;;
	certs=*)
		dir=${want#certs=}
		for f in "$dir"/*.crt; do
			if [ -f "$f" ]; then
				section "cert $f"
				cat -- "$f"
			fi
		done
		;;
	unit=*)
		unit=${want#unit=}
		section "unit $unit"
		systemctl show --no-pager \
			--property=LoadState,UnitFileState,ActiveState,SubState,Result,ExecMainStatus,NRestarts,StateChangeTimestamp \
			-- "$unit.service" 2>&1 || true
		section "journal $unit"
		journalctl --no-pager --quiet --output=short-iso --lines=10 --unit="$unit.service" 2>/dev/null || true
		;;
	volumes=*)
		dir=${want#volumes=}
		section volumes
		if [ -d "$dir" ]; then
			for d in "$dir"/*/; do
				if [ -d "$d" ]; then
					du -sk -x -- "$d" 2>/dev/null || true
				fi
			done
		fi
		;;
	*)
		echo "kip-host: unknown request $want" >&2
		exit 2
		;;
	esac
done

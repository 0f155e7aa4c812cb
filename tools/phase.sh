#!/bin/sh
# phase.sh NAME COMMAND [ARG...]: runs COMMAND and, when KIP_TIMINGS names a file, appends a line
# to it: NAME, the seconds COMMAND took and what it said was cached (the build scripts write
# that to the file KIP_PHASE_NOTE names; tools/timings.sh prints the table at the end of a run).
# Exits as COMMAND exits.
set -u
name=$1
shift
if [ -z "${KIP_TIMINGS:-}" ]; then
	exec "$@"
fi
note=$(mktemp)
start=$(date +%s%N)
KIP_PHASE_NOTE=$note "$@"
rc=$?
end=$(date +%s%N)
printf '%s\t%s\t%s%s\n' "$name" "$(((end - start) / 1000000))" \
	"$(tr '\n' ' ' <"$note" | sed 's/ *$//')" "$([ "$rc" = 0 ] || echo " (failed, exit $rc)")" >>"$KIP_TIMINGS"
rm -f "$note"
exit "$rc"

# Stops a command kip started: sends SIGTERM to the processes named "kip-run-$1" (the wrapper
# the command runs under, which then kills its whole process group; the login shell or sudo on
# the way to it) until none is left. The pattern's [-] keeps grep and this script from finding
# themselves. Exits 0 once none is left, or if none shows up within a second (the command had
# ended, or never started); 1 if some still run after five seconds.
set -eu
found=false
i=0
while [ "$i" -lt 50 ]; do
	pids=
	for f in $(grep -l -- "kip-run[-]$1" /proc/[0-9]*/cmdline 2>/dev/null || true); do
		p=${f#/proc/}
		pids="$pids ${p%/cmdline}"
	done
	if [ -n "$pids" ]; then
		found=true
		# sudo may swallow the signal while it starts the command: hence the loop.
		# shellcheck disable=SC2086 # one word per process
		kill -TERM $pids 2>/dev/null || true
	elif $found || [ "$i" -ge 10 ]; then
		exit 0
	fi
	sleep 0.1
	i=$((i + 1))
done
exit 1

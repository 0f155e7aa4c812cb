# kip node fence on a worker that still answers, after stop.sh: keep k3s-agent from starting (a systemd
# drop-in, also after a reboot), stop it and every container it ran, and unmount what they
# mounted; then list what is left. $1 is "stop" (stop, then list) or "check" (list only), $2 the
# drop-in's path, $3 a pattern matching the command lines of the containers' shims. Prints one
# line for each thing left running or mounted, and exits 1 when there is one.
set -u
PATH=$PATH:/usr/sbin:/sbin
dropin=$2
if [ "$1" = stop ]; then
	mkdir -p "$(dirname "$dropin")"
	# The unit starts only while this file is gone: kip node add removes it when the worker rejoins.
	printf '%s\n' "# kip node fence: this worker is fenced. k3s-agent does not start, also after a reboot," \
		"# until kip node add rejoins the worker and removes this file." \
		"[Unit]" "ConditionPathExists=!$dropin" >"$dropin.tmp"
	mv "$dropin.tmp" "$dropin"
	systemctl daemon-reload
	systemctl stop k3s-agent >/dev/null 2>&1 || true
	stop_containers "$3"
	# What the kubelet and the containers mounted (as k3s-killall.sh does).
	unmount_under '^(/run/k3s|/var/lib/kubelet/pods|/var/lib/kubelet/plugins|/run/netns/cni-)'
fi
left=0
say() { echo "$*"; left=1; }
[ -f "$dropin" ] || say "the fence's drop-in $dropin is missing"
systemctl is-active --quiet k3s-agent && say "k3s-agent is running"
for pid in $(pgrep -f "$3" 2>/dev/null); do say "container shim $pid runs: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)"; done
# The bracket keeps the pattern from matching this shell.
for pid in $(pgrep -f '[l]onghorn' 2>/dev/null); do say "Longhorn process $pid runs: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)"; done
awk '$1 ~ "^/dev/[l]onghorn/" || $2 ~ "^/var/lib/kubelet/(pods|plugins)/" {print $1 " on " $2}' /proc/self/mounts | while read -r m; do echo "mounted: $m"; done
if awk '$1 ~ "^/dev/[l]onghorn/" || $2 ~ "^/var/lib/kubelet/(pods|plugins)/" {found=1} END {exit !found}' /proc/self/mounts; then left=1; fi
exit $left

# What kip's scripts that stop k3s on a host share (wipe.sh and fence.sh start with it).
# stop_containers PATTERN stops every container k3s's containerd ran: the containers' shims,
# whose command lines match PATTERN, outlive k3s's unit (it kills its own process only), so they
# and what runs under them are killed. unmount_under REGEX unmounts every mount whose mount point
# matches REGEX, deepest first.
stop_containers() {
	for pid in $(pgrep -f "$1" 2>/dev/null); do
		for child in $(pgrep -P "$pid" 2>/dev/null); do kill -9 "$child" 2>/dev/null || true; done
		kill -9 "$pid" 2>/dev/null || true
	done
}
unmount_under() {
	awk '{print $2}' /proc/self/mounts | grep -E "$1" | sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
}

# kip's removal of a k3s agent from a host (kip node remove), after stop.sh: stop k3s-agent and every container
# it ran, unmount what they mounted, remove the network interfaces and iptables rules k3s and
# its CNI made, and delete k3s's files. $1 is k3s's binary, $2 the agent's unit file, $3
# "keep-longhorn" to leave /var/lib/longhorn's data in place or "wipe-longhorn" to empty it, $4
# a pattern matching the command lines of the containers' shims. Run again, it finds nothing to
# do.
set -u
PATH=$PATH:/usr/sbin:/sbin
systemctl disable --now k3s-agent >/dev/null 2>&1 || true
stop_containers "$4"
# Mounts under k3s's and the kubelet's directories.
unmount_under '^(/run/k3s|/var/lib/rancher/k3s|/var/lib/kubelet|/run/netns/cni-)'
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
for link in cni0 flannel.1 flannel-v6.1 flannel-wg flannel-wg-v6 kube-ipvs0; do
	ip link delete "$link" 2>/dev/null || true
done
if command -v iptables-save >/dev/null 2>&1; then
	iptables-save | grep -v -e KUBE- -e CNI- -e flannel -e FLANNEL | iptables-restore 2>/dev/null || true
fi
rm -rf /etc/rancher/k3s /run/k3s /run/flannel /var/lib/rancher/k3s /var/lib/kubelet /var/lib/cni /etc/cni/net.d
# The unit, and its drop-ins (kip node fence's among them).
rm -rf "$1" "$2" "$2.d"
systemctl daemon-reload
if [ "$3" = wipe-longhorn ] && [ -d /var/lib/longhorn ]; then
	find /var/lib/longhorn -mindepth 1 -delete
fi

# Prints what preflight needs beyond sshx.Facts, in sections. Each section starts with a line
# "@@kip-preflight NAME" preceded by a newline, so that a section whose output lacks a final
# newline cannot swallow the next header. A missing tool leaves its section empty: preflight
# reports what it cannot see rather than guessing. Usage: preflight.sh ZONE, the firewalld zone
# kip writes.
set -eu
PATH=$PATH:/usr/sbin:/sbin

section() { printf '\n@@kip-preflight %s\n' "$1"; }

# Listening TCP and UDP sockets with the process holding each.
section ports
if command -v ss >/dev/null 2>&1; then
	ss -Hltnup 2>/dev/null || true
fi

# Processes of k3s's own units (k3s runs its components as its own children): their listening
# ports belong to the existing k3s, and they are not another Kubernetes.
k3s_pids=$(for u in k3s k3s-agent; do
	for f in /sys/fs/cgroup/system.slice/$u.service/cgroup.procs /sys/fs/cgroup/systemd/system.slice/$u.service/cgroup.procs; do
		if [ -r "$f" ]; then cat "$f"; fi
	done
done)
section k3s-pids
if [ -n "$k3s_pids" ]; then printf '%s\n' "$k3s_pids"; fi

# Processes of a Kubernetes or container runtime, by name, other than k3s's own children.
section processes
for d in /proc/[0-9]*; do
	name=$(cat "$d/comm" 2>/dev/null) || continue
	case "$name" in
	k3s | k3s-server | k3s-agent | kubelet | kube-apiserver | containerd | dockerd | crio) ;;
	*) continue ;;
	esac
	if [ "${name#k3s}" = "$name" ] && printf '%s\n' "$k3s_pids" | grep -qx "${d#/proc/}"; then
		continue
	fi
	echo "$name"
done | sort -u

# Paths another Kubernetes, or an earlier k3s, leaves behind.
section paths
for p in /etc/kubernetes /var/lib/kubelet /etc/rancher/k3s /usr/local/bin/k3s; do
	if [ -e "$p" ]; then
		echo "$p"
	fi
done

# CNI configuration files.
section cni
if [ -d /etc/cni/net.d ]; then
	ls -A /etc/cni/net.d 2>/dev/null || true
fi

# The host firewall, read by host.ParseFirewall: whether ufw is active and kip's marker on its
# rules, which ufw show added lists while ufw is inactive too; whether firewalld runs ("not
# running" is on stderr); and the file of the firewalld zone kip writes, $1.
section ufw
if command -v ufw >/dev/null 2>&1; then
	ufw status verbose 2>/dev/null || true
fi

section ufw-added
if command -v ufw >/dev/null 2>&1; then
	ufw show added 2>/dev/null || true
fi

section firewalld
if command -v firewall-cmd >/dev/null 2>&1; then
	firewall-cmd --state 2>&1 || true
fi

section firewalld-zone
if [ -f "/etc/firewalld/zones/$1.xml" ]; then
	cat "/etc/firewalld/zones/$1.xml"
fi

# What is already on the host: k3s's release, whether it has run as a server (it has a cluster),
# what systemd says of its unit (the invocation ID changes with every start), and an unfinished
# install's intent (install.IntentPath).
section k3s-version
if [ -x /usr/local/bin/k3s ]; then
	/usr/local/bin/k3s --version 2>/dev/null | head -n 1 || true
fi

section server-data
if [ -d /var/lib/rancher/k3s/server/tls ]; then echo yes; fi

section k3s-unit
systemctl show k3s -p ActiveState -p UnitFileState -p InvocationID 2>/dev/null || true

section intent
if [ -f /var/lib/kipper/install-intent.json ]; then cat /var/lib/kipper/install-intent.json; fi

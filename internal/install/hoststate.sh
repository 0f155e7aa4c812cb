# kip install: what is already on the host, in one round trip.
set -u
section() { printf '\n@@kip-state %s\n' "$1"; }

section k3s-version
if [ -x /usr/local/bin/k3s ]; then
	/usr/local/bin/k3s --version 2>/dev/null | head -n 1 || true
fi

section server-data
if [ -d /var/lib/rancher/k3s/server/tls ]; then echo yes; fi

# An unfinished install's intent (install.IntentPath).
section intent
if [ -f /var/lib/kipper/install-intent.json ]; then cat /var/lib/kipper/install-intent.json; fi

# systemd's ID of k3s's current run: a new one means k3s restarted since.
section k3s-invocation
systemctl show k3s -p InvocationID --value 2>/dev/null || true


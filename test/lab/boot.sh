#!/bin/sh
# Runs one lab host: boot.sh CGROUP... -- NSPAWN-ARGUMENT...
# Moves itself into the host's own cgroups (systemd-nspawn --keep-unit makes its payload and
# supervisor cgroups under the caller's), then boots the host with systemd-nspawn. A reboot inside
# the host ends nspawn with status 133 and boots it again, as a real machine would come back;
# any other end (poweroff, a killed init) ends this script with nspawn's status.
set -eu

while [ "$1" != -- ]; do
	mkdir -p "$1"
	echo $$ >"$1/cgroup.procs"
	shift
done
shift

while :; do
	rc=0
	systemd-nspawn "$@" || rc=$?
	if [ "$rc" != 133 ]; then
		echo "kip-lab: systemd-nspawn exited $rc"
		exit "$rc"
	fi
	echo "kip-lab: the host rebooted; booting it again"
done

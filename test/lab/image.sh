#!/bin/sh
# The recipe of the lab's base image (its hash names the cached tarball): a minimal Debian
# bookworm that boots under systemd-nspawn with sshd, root logging in by key only.
# Usage: image.sh DIR MIRROR PROXY (PROXY may be empty). Runs as root on the build machine.
set -eu

dir=$1
mirror=$2
if [ -n "$3" ]; then
	export http_proxy="$3"
fi

debootstrap --variant=minbase \
	--include=systemd,systemd-sysv,dbus,openssh-server,iproute2,iptables,sudo,ca-certificates,kmod,curl,runc,containernetworking-plugins \
	bookworm "$dir" "$mirror"

cd "$dir"

# systemd makes up a machine id at boot when the file is empty (the lab writes one per host);
# without the file it would not boot with a read-only /etc, and a shared one would clash.
: >etc/machine-id
rm -f var/lib/dbus/machine-id

# Every host gets host keys of its own, made when sshd first starts.
rm -f etc/ssh/ssh_host_*
mkdir -p etc/systemd/system/ssh.service.d
cat >etc/systemd/system/ssh.service.d/kip-lab.conf <<'UNIT'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
UNIT
cat >etc/ssh/sshd_config.d/kip-lab.conf <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
CONF
install -d -m 700 root/.ssh

# nspawn mounts the cgroup v1 controllers read-only; containers (runc, under k3s's kubelet) make
# their cgroups there. The host has its own cgroup in each (the lab makes them), so it may write
# below it.
cat >etc/systemd/system/kip-cgroup-rw.service <<'UNIT'
[Unit]
Description=kip lab: make the cgroup v1 controllers writable for containers
DefaultDependencies=no
Before=sysinit.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for d in /sys/fs/cgroup/*; do case $$d in */systemd|*/unified) ;; *) mount -o remount,bind,rw $$d ;; esac; done'
[Install]
WantedBy=sysinit.target
UNIT
mkdir -p etc/systemd/system/sysinit.target.wants
ln -sf ../kip-cgroup-rw.service etc/systemd/system/sysinit.target.wants/kip-cgroup-rw.service

# Units that cannot work in a container, or would reach beyond the lab. run-rpc_pipefs.mount
# comes with nfs-common (which kip installs) and needs the rpc_pipefs file system, which the
# lab's kernel does not have.
for unit in \
	getty@tty1.service console-getty.service serial-getty@console.service \
	systemd-networkd-wait-online.service systemd-timesyncd.service \
	apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
	e2scrub_all.timer e2scrub_reap.service fstrim.timer \
	systemd-firstboot.service run-rpc_pipefs.mount; do
	ln -sf /dev/null "etc/systemd/system/$unit"
done

# The lab writes the sources, the proxy, the host name and the hosts file of each host.
: >etc/apt/sources.list
: >etc/resolv.conf
: >etc/hostname
rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb var/log/*.log

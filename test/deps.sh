#!/bin/sh
# Installs the Debian packages kip's tests need, when they are missing: sshd and sudo for the SSH
# tests; systemd-nspawn, debootstrap, apt-cacher-ng, zstd, iptables and iproute2 for the lab hosts
# (test/lab), and e2fsprogs and mount for their Longhorn disks (mkfs.ext4, mount -o loop, losetup:
# Priority required, but not Essential, so a minimal system may lack them); busybox-static for the
# lab's container images, and postgresql-15 and postgresql-client-15 for its postgres image; acl and
# attr (getfacl, getfattr) for the data mover's tests. No service is started: the lab runs its own
# apt-cacher-ng, and the PostgreSQL packages' own server is not wanted.
set -eu

missing=""
want() { # want COMMAND PACKAGE: PACKAGE is missing when COMMAND is not found
	command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ] || missing="$missing $2"
}
want sshd openssh-server
want sudo sudo
want ssh openssh-client
want systemd-nspawn systemd-container
want debootstrap debootstrap
want apt-cacher-ng apt-cacher-ng
want zstd zstd
want iptables iptables
want ip iproute2
want mkfs.ext4 e2fsprogs
want losetup mount
# The data mover's tests compare trees with getfacl and getfattr.
want getfacl acl
want getfattr attr
# The lab's postgres image is built from Debian's PostgreSQL 15 server and client programs
# (test/images -set postgres), which are not on PATH.
want /usr/lib/postgresql/15/bin/postgres postgresql-15
want /usr/lib/postgresql/15/bin/pg_restore postgresql-client-15
# The lab's container images are built from Debian's static busybox (test/images); the busybox
# package's is dynamically linked.
if ! [ -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then
	missing="$missing busybox-static"
fi

# note TEXT: what make test's table of timings says of this phase (tools/phase.sh).
note() { if [ -n "${KIP_PHASE_NOTE:-}" ]; then echo "$*" >>"$KIP_PHASE_NOTE"; fi; }
if [ -z "$missing" ]; then
	note "all installed already"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "test-deps: missing$missing; install them (as root: apt-get install$missing)" >&2
	exit 1
fi
echo "test-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting services (apt-cacher-ng's would take port 3142 on every
# address): a policy-rc.d that denies every start, unless the machine already has one.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
	trap 'rm -f "$policy"' EXIT
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
fi
apt-get update -qq
# shellcheck disable=SC2086 # the package list is meant to split
apt-get install -y -qq --no-install-recommends $missing
note "installed$missing"

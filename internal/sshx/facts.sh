# Prints what kip needs to know about a host, in sections. Each section starts with a line
# "@@kip-facts NAME" preceded by a newline, so that a section whose output lacks a final newline
# cannot swallow the next header. Arguments are paths whose file systems to report ("df 0" for
# the first, and so on). A missing tool leaves its section empty: kip reports what it cannot see.
set -eu
PATH=$PATH:/usr/sbin:/sbin

section() { printf '\n@@kip-facts %s\n' "$1"; }

section os-release
cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null || true
section kernel
uname -r
section arch
uname -m
section cpus
nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || true
section meminfo
cat /proc/meminfo 2>/dev/null || true

i=0
for p in "$@"; do
	# A path that does not exist yet will live on its nearest existing parent's file system.
	d=$p
	while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
	section "df $i"
	df -Pk -- "$d" 2>/dev/null || true
	i=$((i + 1))
done

section ip-addr
ip -j -4 addr show 2>/dev/null || true
section ip-route
ip -j -4 route show 2>/dev/null || true

section init
if [ -d /run/systemd/system ]; then
	echo systemd
else
	cat /proc/1/comm 2>/dev/null || true
fi

section modules
for m in wireguard iscsi_tcp nfs; do
	if [ -d "/sys/module/$m" ]; then
		state=loaded
	elif command -v modprobe >/dev/null 2>&1 && modprobe -n -q "$m" 2>/dev/null; then
		state=loadable
	else
		state=unavailable
	fi
	echo "$m $state"
done

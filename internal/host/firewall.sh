# Prints what kip needs to know about the host's firewall, in sections: firewall.sh ZONE POD-ZONE
# POD-POLICY, where ZONE and POD-ZONE are the firewalld zones kip writes, and POD-POLICY its policy. Each section starts with a line
# "@@kip-firewall NAME" preceded by a newline, so that a section whose output lacks a final
# newline cannot swallow the next header. A missing tool or file leaves its section empty.
set -eu
PATH=$PATH:/usr/sbin:/sbin
zone=$1
pod_zone=$2
pod_policy=$3

section() { printf '\n@@kip-firewall %s\n' "$1"; }

# Whether ufw is active, its default policies and its rules (with their comments).
section ufw
if command -v ufw >/dev/null 2>&1; then
	ufw status verbose
fi

# The rules as the commands that added them, which ufw keeps while it is inactive too.
section ufw-added
if command -v ufw >/dev/null 2>&1; then
	ufw show added
fi

# "running", or "not running" (on stderr, with a non-zero status).
section firewalld
if command -v firewall-cmd >/dev/null 2>&1; then
	firewall-cmd --state 2>&1 || true
fi

section firewalld-default
if [ -f /etc/firewalld/firewalld.conf ]; then
	sed -n 's/^DefaultZone=//p' /etc/firewalld/firewalld.conf
fi

section firewalld-zone
if [ -f "/etc/firewalld/zones/$zone.xml" ]; then
	cat "/etc/firewalld/zones/$zone.xml"
fi

section firewalld-pod-zone
if [ -f "/etc/firewalld/zones/$pod_zone.xml" ]; then
	cat "/etc/firewalld/zones/$pod_zone.xml"
fi

section firewalld-pod-policy
if [ -f "/etc/firewalld/policies/$pod_policy.xml" ]; then
	cat "/etc/firewalld/policies/$pod_policy.xml"
fi

# The ports sshd listens on, so that kip never enables a firewall that shuts SSH out.
section sshd-ports
if command -v sshd >/dev/null 2>&1; then
	sshd -T 2>/dev/null | sed -n 's/^port //p' || true
fi

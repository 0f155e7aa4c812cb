# Makes firewalld enforce kip's zones: firewalld.sh ZONE ZONE-FILE-CONTENT POD-ZONE
# POD-ZONE-FILE-CONTENT POD-POLICY POD-POLICY-FILE-CONTENT. Writes the zones' and the policy's
# files (an empty content removes the file; the policy is written after the zone it names), makes ZONE
# the default zone, and reloads a running firewalld or starts a stopped one (the zone opens SSH
# before either). Then restarts k3s if it runs: a reload drops the rules k3s added.
set -eu
PATH=$PATH:/usr/sbin:/sbin
umask 022
zone=$1

# write DIR NAME CONTENT: the file of zone or policy NAME in /etc/firewalld/DIR, whole or not at
# all; removed when CONTENT is empty.
write() {
	file=/etc/firewalld/$1/$2.xml
	shift
	if [ -z "$2" ]; then
		rm -f "$file"
		return
	fi
	printf '%s' "$2" >"$file.kip-tmp"
	mv -f "$file.kip-tmp" "$file"
}

mkdir -p /etc/firewalld/zones /etc/firewalld/policies
if [ -z "$6" ]; then
	write policies "$5" ""
fi
write zones "$3" "$4"
write zones "$1" "$2"
if [ -n "$6" ]; then
	write policies "$5" "$6"
fi

if [ "$(firewall-cmd --state 2>&1 || true)" = running ]; then
	firewall-cmd --reload >/dev/null
	if [ "$(firewall-cmd --get-default-zone)" != "$zone" ]; then
		firewall-cmd --set-default-zone="$zone" >/dev/null
	fi
	systemctl enable --quiet firewalld
else
	if [ "$(firewall-offline-cmd --get-default-zone)" != "$zone" ]; then
		firewall-offline-cmd --set-default-zone="$zone" >/dev/null
	fi
	systemctl enable --quiet --now firewalld
fi

for unit in k3s k3s-agent; do
	if systemctl is-active --quiet "$unit"; then
		systemctl restart "$unit"
	fi
done

# kip's disk-sync check (kip node storage --copies, and the end of kip node add): how long the
# disk under Longhorn's directory takes to sync small writes. $1 is the directory, $2 the number
# of batches, $3 the 4 KiB writes per batch, each synced before the next (dd oflag=dsync), $4 a
# batch duration in seconds that ends the check (a stall). Prints "mount SOURCE FSTYPE" once,
# then "batch SECONDS" for each batch, as dd measured it.
set -eu
dir=$1
test -d "$dir"
# The mount that holds the directory is the last findmnt lists: a mount stacked on another is
# listed after it.
echo "mount $(findmnt -n -o SOURCE,FSTYPE --target "$dir" | tail -n 1)"
f="$dir/.kip-sync-check"
trap 'rm -f "$f"' EXIT
i=0
while [ "$i" -lt "$2" ]; do
	out=$(LC_ALL=C dd if=/dev/zero of="$f" bs=4096 count="$3" oflag=dsync conv=notrunc 2>&1 | tail -n 1)
	s=$(echo "$out" | sed -n 's/.* copied, \([0-9.e+-]*\) s,.*/\1/p')
	if [ -z "$s" ]; then
		echo "dd: $out" >&2
		exit 1
	fi
	echo "batch $s"
	if awk -v s="$s" -v l="$4" 'BEGIN { exit !(s >= l) }'; then
		break
	fi
	i=$((i + 1))
done

#!/bin/sh
# Fails when git tracks a file over 1 MiB or an executable binary (ELF, Mach-O, PE, or any
# file with NUL bytes and the executable bit): build outputs go under the ignored bin/.
set -eu
limit=1048576
bad=0
git ls-files -z | xargs -0 -r stat -c '%s %A %n' -- 2>/dev/null | while read -r size mode name; do
	if [ "$size" -gt "$limit" ]; then
		echo "tracked file over 1 MiB: $name ($size bytes); keep build outputs and data under bin/ or out of git"
		echo x
	fi
	case "$mode" in
	*x*)
		magic=$(od -An -tx1 -N4 -- "$name" | tr -d ' \n')
		case "$magic" in
		7f454c46 | cffaedfe | cefaedfe | feedface | feedfacf | 4d5a*)
			echo "tracked executable binary: $name; binaries are built into the ignored bin/"
			echo x
			;;
		esac
		;;
	esac
done | {
	while read -r line; do
		if [ "$line" = x ]; then bad=1; else echo "$line" >&2; fi
	done
	exit "$bad"
}

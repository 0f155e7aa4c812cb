#!/bin/sh
# gotest.sh NAME GO-TEST-ARG...: runs go test with the arguments as the phase NAME
# (tools/phase.sh), and records beside it each package's time as go test reported it ("result
# cached" when go reused an earlier run's result). Exits as go test exits.
set -u
name=$1
shift
dir=$(dirname "$0")
out=$(mktemp)
rc=$(mktemp)
trap 'rm -f "$out" "$rc"' EXIT
{
	sh "$dir/phase.sh" "$name" go test "$@" 2>&1
	echo $? >"$rc"
} | tee "$out"
if [ -n "${KIP_TIMINGS:-}" ]; then
	awk '
	function ms(d) { sub(/s$/, "", d); return int(d * 1000) }
	/^(ok|FAIL)[ \t]+[^ \t]+[ \t]+([0-9.]+s|\(cached\))/ {
		note = $1 == "FAIL" ? "FAILED" : ""
		if ($3 == "(cached)") { print "    " $2 "\t0\tresult cached"; next }
		print "    " $2 "\t" ms($3) "\t" note
	}' "$out" >>"$KIP_TIMINGS"
fi
exit "$(cat "$rc")"

#!/bin/sh
# Prints, from a go test log, each failing test with what it logged: first the last 30 of its
# lines that are neither a kip command the end-to-end harness ran nor how that command ended nor
# a measurement (its t.Fatal and t.Error among them, however far up), then the last 12 lines its
# test files logged; each line cut to 400 characters. A summary for the end of a long run's
# output, where the failure itself may be thousands of lines up.
set -eu
awk '
function flush(   from, i) {
	if (name == "") return
	print "--- FAIL: " name
	if (m > 0) {
		print "  its lines other than kip commands, their ends and measurements (the last 30):"
		from = m > 30 ? m - 29 : 1
		for (i = from; i <= m; i++) print "    " substr(other[i], 1, 400)
	}
	print "  the last lines it logged:"
	from = n > 12 ? n - 11 : 1
	for (i = from; i <= n; i++) print "    " substr(lines[i], 1, 400)
	name = ""; n = 0; m = 0
}
/^[ \t]*--- FAIL: / { flush(); name = $3; n = 0; m = 0; next }
/^(ok|FAIL|---|===|PASS)[ \t]/ { flush(); next }
name != "" && /^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / {
	sub(/^[ \t]+/, "")
	lines[++n] = $0
	text = $0
	sub(/^[^ ]+ /, "", text)
	if (text ~ /^([A-Z_]+=[^ ]* )*kip( |$)/ || text ~ /^kip (exited -?[0-9]+|ended by .*)$/ || text ~ /^measured: /) next
	other[++m] = $0
}
END { flush() }
' "$1"

#!/bin/sh
# Prints, from a go test log, each failing test with the last lines its test files logged (its
# t.Fatal or t.Error among them), each cut to 400 characters: a summary for the end of a long
# run's output, where the failure itself may be thousands of lines up.
set -eu
awk '
function flush() {
	if (name == "") return
	print "--- FAIL: " name
	from = n > 12 ? n - 11 : 1
	for (i = from; i <= n; i++) print "    " substr(lines[i], 1, 400)
	name = ""; n = 0
}
/^[ \t]*--- FAIL: / { flush(); name = $3; n = 0; next }
/^(ok|FAIL|---|===|PASS)[ \t]/ { flush(); next }
name != "" && /^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / { sub(/^[ \t]+/, ""); lines[++n] = $0 }
END { flush() }
' "$1"

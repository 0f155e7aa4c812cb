#!/bin/sh
# make test: installs the test dependencies, builds the test environment, lints and runs every test
# tier, recording how long each phase took in KIP_TIMINGS (default bin/timings.tsv; print it with
# sh tools/timings.sh print bin/timings.tsv, as .ci/run does at the end).
#
# The order puts the waiting beside the work. The lab's own tests (test/lab) boot hosts and wait
# on them: they start as soon as the lab's image is there and run in the background while the
# linter and the builds keep both cores busy; their output is printed when they end, after the
# other tiers. The end-to-end tests wait for their lab until test/lab has removed its own (one lab
# at a time: test/lab's lock). The unit, API and SSH tiers run beside the end-to-end tests, then
# the packages with fault-injection tests (-tags kipfault) run again.
set -u
cd "$(dirname "$0")/.."
GO=${GO:?tools/test.sh is make test: run make test}
TESTFLAGS=${TESTFLAGS:?tools/test.sh is make test: run make test}
KIP_TIMINGS=${KIP_TIMINGS:-$(pwd)/bin/timings.tsv}
export KIP_TIMINGS

phase() { sh tools/phase.sh "$@"; }
lab_out=$(mktemp)
lab_rc=$(mktemp)
trap 'rm -f "$lab_out" "$lab_rc"' EXIT
lab_pid=
# finish STATUS: waits for test/lab, prints its output, and exits with STATUS, or with test/lab's
# when STATUS is 0.
finish() {
	if [ -n "$lab_pid" ]; then
		wait "$lab_pid"
		cat "$lab_out"
		lab=$(cat "$lab_rc")
		if [ "$1" = 0 ] && [ "$lab" != 0 ]; then exit "$lab"; fi
	fi
	exit "$1"
}
step() { "$@" || finish $?; }

mkdir -p bin
sh tools/timings.sh begin "$KIP_TIMINGS"
step phase "Debian test packages (test/deps.sh)" sh test/deps.sh
step phase "Go modules (tools/testenv and kip's)" sh tools/testenv.sh modules
step phase "build: lab image" sh tools/testenv.sh lab
{
	# shellcheck disable=SC2086 # TESTFLAGS is a list of flags
	sh tools/gotest.sh "tests: test/lab (beside the builds)" $TESTFLAGS ./test/lab >"$lab_out" 2>&1
	echo $? >"$lab_rc"
} &
lab_pid=$!
step phase "lint (gofmt, go vet, go vet -tags kipfault, the tree)" make --no-print-directory lint
step phase "build: control plane" sh tools/testenv.sh control
step phase "build: node components and the lab's container images" sh tools/testenv.sh node
step phase "build: Velero" sh tools/testenv.sh velero
step phase "build: CSI sidecars" sh tools/testenv.sh csi
step phase "build: kip (bin/kip-fault) and the k3s stand-in" make --no-print-directory build-fault k3s-standin
# The end-to-end package first: go test starts packages in the order it is given them, and the
# end-to-end tests take longest; the other packages run beside them, two at a time in all. The
# packages whose tests bring up lab hosts of their own (lab.ForTest) come after: they would wait
# for the end-to-end tests' lab (one lab at a time) past their tests' limit.
own_lab=$(grep -rl --include='*_test.go' '"kipper.run/kip/test/lab"' cmd internal | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
# shellcheck disable=SC2086
step sh tools/gotest.sh "tests: unit, API, SSH and end-to-end tiers" $TESTFLAGS ./test/e2e \
	$($GO list ./... | grep -v -e '^kipper.run/kip/test/lab$' -e '^kipper.run/kip/test/e2e$' \
		$(for d in $own_lab; do printf -- '-e ^kipper.run/kip/%s$ ' "${d#./}"; done))
if [ -n "$own_lab" ]; then
	# shellcheck disable=SC2086
	step sh tools/gotest.sh "tests: packages with lab hosts of their own" $TESTFLAGS $own_lab
fi
fault=$(grep -rl --include='*_test.go' '^//go:build kipfault' cmd internal test | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
if [ -n "$fault" ]; then
	# shellcheck disable=SC2086
	step sh tools/gotest.sh "tests: fault-injection packages (-tags kipfault)" $TESTFLAGS -tags kipfault $fault
fi
finish 0

#!/bin/sh
# make test: installs the test dependencies, builds the test environment, lints and runs every test
# tier, recording how long each phase took in KIP_TIMINGS (default bin/timings.tsv; print it with
# sh tools/timings.sh print bin/timings.tsv, as .ci/run does at the end).
#
# The order puts the waiting beside the work. The lab's own tests (test/lab) boot hosts and wait
# on them: they start as soon as the lab's image is there and run in the background while the
# linter and the builds keep both cores busy; their output is printed when they end, after the
# other tiers. The end-to-end tests start once test/lab has ended (one lab at a time: test/lab's
# lock, below). The unit, API and SSH tiers run beside the end-to-end tests, and so
# do the packages with fault-injection tests, again with -tags kipfault; their output is printed
# at the end too.
set -u
cd "$(dirname "$0")/.."
GO=${GO:?tools/test.sh is make test: run make test}
TESTFLAGS=${TESTFLAGS:?tools/test.sh is make test: run make test}
KIP_TIMINGS=${KIP_TIMINGS:-$(pwd)/bin/timings.tsv}
export KIP_TIMINGS

phase() { sh tools/phase.sh "$@"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jobs_started=
# background NAME COMMAND...: runs COMMAND in the background, its output kept for finish.
background() {
	name=$1
	shift
	{
		"$@" >"$tmp/$name.out" 2>&1
		echo $? >"$tmp/$name.rc"
	} &
	echo $! >"$tmp/$name.pid"
	jobs_started="$jobs_started $name"
}
# finish STATUS: waits for the background jobs, prints their output, and exits with STATUS, or
# with the first failed job's when STATUS is 0.
finish() {
	status=$1
	for name in $jobs_started; do
		wait "$(cat "$tmp/$name.pid")"
		cat "$tmp/$name.out"
		rc=$(cat "$tmp/$name.rc")
		if [ "$status" = 0 ] && [ "$rc" != 0 ]; then status=$rc; fi
	done
	exit "$status"
}
step() { "$@" || finish $?; }

mkdir -p bin
sh tools/timings.sh begin "$KIP_TIMINGS"
step phase "Debian test packages (test/deps.sh)" sh test/deps.sh
step phase "Go modules (tools/testenv and kip's)" sh tools/testenv.sh modules
step phase "build: lab image" sh tools/testenv.sh lab
# shellcheck disable=SC2086 # TESTFLAGS is a list of flags
background lab sh tools/gotest.sh "tests: test/lab (beside the builds)" $TESTFLAGS ./test/lab
step phase "lint (gofmt, go vet, go vet -tags kipfault, the tree)" make --no-print-directory lint
step phase "build: control plane" sh tools/testenv.sh control
step phase "build: node components and the lab's container images" sh tools/testenv.sh node
step phase "build: Velero" sh tools/testenv.sh velero
step phase "build: CSI sidecars" sh tools/testenv.sh csi
step phase "build: PostgreSQL image" sh tools/testenv.sh postgres
step phase "build: kip (bin/kip-fault) and the k3s stand-in" make --no-print-directory build-fault k3s-standin
# The packages with fault-injection tests run again with -tags kipfault, beside the other tiers:
# their kill-after-every-write tests run kip once per write and mostly wait on it.
fault=$(grep -rl --include='*_test.go' '^//go:build kipfault' cmd internal test | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
if [ -n "$fault" ]; then
	# shellcheck disable=SC2086
	background fault sh tools/gotest.sh "tests: fault-injection packages (-tags kipfault, beside the others)" $TESTFLAGS -tags kipfault $fault
fi
# test/lab's tests each take the lab's lock (one lab at a time) and release it: the end-to-end
# package, started between two of them, would hold it for its whole run while the next one's wait
# runs out (a warm run at fc4b705: TestLonghornDisk, "lock /run/kip-lab.lock: context deadline
# exceeded"). So test/lab ends first; its output is still printed at the end.
wait "$(cat "$tmp/lab.pid")"
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
finish 0

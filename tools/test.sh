#!/bin/sh
# make test: installs the test dependencies, builds the test environment, lints and runs every test
# tier, recording how long each phase took in KIP_TIMINGS (default bin/timings.tsv; print it with
# sh tools/timings.sh print bin/timings.tsv, as .ci/run does at the end).
#
# The order puts the waiting beside the work. The lab's own tests (test/lab) boot hosts and wait
# on them: they start as soon as the lab's image is there and run in the background while the
# linter and the builds keep both cores busy. Then the unit, API and SSH tiers run, and beside
# them the packages with fault-injection tests again with -tags kipfault; then the packages with
# lab hosts of their own, once test/lab has ended (one lab at a time: test/lab's lock, below).
# The end-to-end tests run last, alone. The background jobs' output is printed at the end.
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
# The older Kubernetes release the k3s upgrade test starts from: after the control plane and the
# node components, whose directory it links into.
step phase "build: the older Kubernetes release (the k3s upgrade test)" sh tools/testenv.sh older
step phase "build: kip (bin/kip-fault) and the k3s stand-ins" make --no-print-directory build-fault k3s-standin k3s-standin-older
# The end-to-end tests run alone, last: their lab's clusters keep both cores busy for most of
# their run, and the tiers beside them (a fresh-clone run at 4c72fbd) stretched the whole to 50
# minutes and their waits past their limits. Before them, side by side, the unit, API and SSH
# tiers, the packages whose tests bring up lab hosts of their own (lab.ForTest), and the packages
# with fault-injection tests again with -tags kipfault: their kill-after-every-write tests run kip
# once per write and mostly wait on it. Only the tests of their kipfault files run again: the
# rest of each package runs in the other tiers.
faultfiles=$(grep -rl --include='*_test.go' '^//go:build kipfault' cmd internal test)
if [ -n "$faultfiles" ]; then
	fault=$(echo "$faultfiles" | xargs -n1 dirname | sort -u | sed 's|^|./|')
	faulttests=$(echo "$faultfiles" | xargs sed -n 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/p' | grep -vx TestMain | sort -u | paste -sd'|' -)
	# shellcheck disable=SC2086
	background fault sh tools/gotest.sh "tests: the fault-injection tests (-tags kipfault, beside the API tier)" $TESTFLAGS -tags kipfault -run "^($faulttests)\$" $fault
fi
own_lab=$(grep -rl --include='*_test.go' '"kipper.run/kip/test/lab"' cmd internal | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
# shellcheck disable=SC2086
step sh tools/gotest.sh "tests: unit, API and SSH tiers" $TESTFLAGS \
	$($GO list ./... | grep -v -e '^kipper.run/kip/test/lab$' -e '^kipper.run/kip/test/e2e$' \
		$(for d in $own_lab; do printf -- '-e ^kipper.run/kip/%s$ ' "${d#./}"; done))
# test/lab's tests each take the lab's lock (one lab at a time) and release it: a package of lab
# hosts started between two of them would hold it while the next one's wait runs out (a warm run
# at fc4b705: TestLonghornDisk, "lock /run/kip-lab.lock: context deadline exceeded"). So test/lab
# ends first; its output is still printed at the end.
wait "$(cat "$tmp/lab.pid")"
if [ -n "$own_lab" ]; then
	# shellcheck disable=SC2086
	step sh tools/gotest.sh "tests: packages with lab hosts of their own" $TESTFLAGS $own_lab
fi
# The end-to-end tests take longest: they do not start when the fault-injection tests failed.
if [ -n "$faultfiles" ]; then
	wait "$(cat "$tmp/fault.pid")"
	[ "$(cat "$tmp/fault.rc")" = 0 ] || finish 0
fi
# shellcheck disable=SC2086
step sh tools/gotest.sh "tests: end-to-end tier (alone)" $TESTFLAGS ./test/e2e
finish 0

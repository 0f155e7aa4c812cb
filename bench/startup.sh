#!/bin/sh
# Compares the start-up wall time of `kip version` with `kubectl version --client` on this
# machine (kubectl v1.37.2 from the test environment, `make testenv`). Usage: bench/startup.sh [runs]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-200}
kip=$root/bin/kip
kubectl=$root/bin/testenv/kubectl
[ -x "$kip" ] || make -C "$root" build >/dev/null
[ -x "$kubectl" ] || { echo "no $kubectl: run make testenv" >&2; exit 1; }

# time_runs CMD...: prints the mean wall time per run in milliseconds, after 10 warm-up runs.
time_runs() {
	i=0
	while [ $i -lt 10 ]; do "$@" >/dev/null 2>&1; i=$((i + 1)); done
	start=$(date +%s%N)
	i=0
	while [ $i -lt "$runs" ]; do "$@" >/dev/null 2>&1; i=$((i + 1)); done
	end=$(date +%s%N)
	echo $(((end - start) / runs / 1000)) | awk '{printf "%.2f", $1 / 1000}'
}

k=$(time_runs "$kip" version)
c=$(time_runs "$kubectl" version --client)
echo "kip version:              $k ms per run ($runs runs)"
echo "kubectl version --client: $c ms per run ($runs runs)"
awk -v k="$k" -v c="$c" 'BEGIN { printf "ratio kip/kubectl:        %.2f\n", k / c }'

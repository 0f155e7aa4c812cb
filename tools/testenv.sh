#!/bin/sh
# Builds the binaries of kip's test environment (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) from Go modules, caches them outside the checkout keyed by a
# stamp of their recipe, and links the cached directory to bin/testenv.
# Nothing built here is ever linked into kip.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}
k8s_version=$(cd "$root/tools/testenv" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kwok_version=v0.8.0

stamp=$( (cat "$root/tools/testenv/go.mod" "$root/tools/testenv/go.sum" \
	"$root/tools/etcd/go.mod" "$root/tools/etcd/go.sum" "$root/tools/etcd/main.go" \
	"$root/tools/testenv.sh"; go env GOVERSION GOARCH) | sha256sum | cut -c1-16)
dir=$cache_root/testenv/$k8s_version-$stamp

link() {
	mkdir -p "$root/bin"
	ln -sfn "$dir" "$root/bin/testenv"
}

if [ -f "$dir/.complete" ]; then
	link
	echo "testenv: $k8s_version binaries cached in $dir"
	exit 0
fi

echo "testenv: building $k8s_version binaries into $dir (about 25 minutes on 2 cores when cold)"
tmp=$dir.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"

minor=$(echo "$k8s_version" | cut -d. -f2)
major=$(echo "$k8s_version" | cut -d. -f1 | tr -d v)
ldflags="-s -w
 -X k8s.io/component-base/version.gitVersion=$k8s_version
 -X k8s.io/component-base/version.gitMajor=$major
 -X k8s.io/component-base/version.gitMinor=$minor
 -X k8s.io/component-base/version.gitTreeState=clean
 -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version
 -X k8s.io/client-go/pkg/version.gitMajor=$major
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

(cd "$root/tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" .)
(cd "$root/tools/testenv" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubectl)
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"

# kwok's stage configurations make its fake kubelets move Nodes and Pods through their lifecycle:
# nodes initialise and heartbeat; pods become ready, complete and are deleted at once (the
# "fast" set: no random delays, so tests wait on kip, not on simulated kubelets).
kwok_src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$kwok_version/kustomize/stage
mkdir -p "$tmp/kwok-stages"
cp "$kwok_src/node/fast/node-initialize.yaml" "$kwok_src/node/heartbeat/node-heartbeat.yaml" \
	"$kwok_src"/pod/fast/pod-*.yaml "$tmp/kwok-stages/"
chmod -R u+w "$tmp/kwok-stages"

echo "$k8s_version" >"$tmp/VERSION"
touch "$tmp/.complete"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$tmp" "$dir"
trap - EXIT
link
# Earlier builds are superseded by this recipe; each is about 450 MB.
for old in "$cache_root"/testenv/*; do
	[ "$old" = "$dir" ] || rm -rf "$old"
done
echo "testenv: built $k8s_version binaries in $dir"

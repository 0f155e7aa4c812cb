#!/bin/sh
# Builds the binaries of kip's test environment from Go modules: the control plane
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok), the node
# components lab hosts run under the k3s stand-in (kubelet, kube-proxy, containerd, its runc shim
# and ctr) and the container images they import (images/*.tar: pause, CoreDNS, the local-path
# provisioner, busybox; test/images). Caches them outside the checkout keyed by a stamp of their
# recipe, and links the cached directory to bin/testenv.
# Nothing built here is ever linked into kip.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}
k8s_version=$(cd "$root/tools/testenv" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kwok_version=v0.8.0
containerd_version=v2.4.2
coredns_version=v1.14.6
local_path_version=v0.0.30
# The kubelet reports the k3s release, as k3s's own does: kip reads a node's k3s version there.
k3s_version=$(sed -n '/^  - name: k3s$/{n;s/^    version: //p;}' "$root/manifests/versions.yaml")
[ -n "$k3s_version" ] || { echo "testenv: no k3s version in manifests/versions.yaml" >&2; exit 1; }

stamp=$( (cat "$root/tools/testenv/go.mod" "$root/tools/testenv/go.sum" \
	"$root/tools/etcd/go.mod" "$root/tools/etcd/go.sum" "$root/tools/etcd/main.go" \
	"$root/tools/testenv.sh"; echo "$k3s_version"; go env GOVERSION GOARCH) | sha256sum | cut -c1-16)
dir=$cache_root/testenv/$k8s_version-$stamp

link() {
	mkdir -p "$root/bin"
	ln -sfn "$dir" "$root/bin/testenv"
}

# images builds the lab's container images into $dir/images from the cached binaries, again
# whenever their recipe (test/images) changed: seconds, not the binaries' build.
images() {
	img_stamp=$(cat "$root"/test/images/*.go "$root"/test/images/pause/*.go | sha256sum | cut -c1-16)
	if [ "$(cat "$dir/images/.stamp" 2>/dev/null)" = "$img_stamp" ]; then
		return
	fi
	rm -rf "$dir/images" "$dir/images.tmp"
	mkdir -p "$dir/images.tmp"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/pause" ./test/images/pause)
	(cd "$root" && go run ./test/images -bin "$dir" -busybox /bin/busybox -out "$dir/images.tmp")
	echo "$img_stamp" >"$dir/images.tmp/.stamp"
	mv "$dir/images.tmp" "$dir/images"
	echo "testenv: built the lab's container images in $dir/images"
}

if [ -f "$dir/.complete" ]; then
	images
	link
	echo "testenv: $k8s_version binaries cached in $dir"
	exit 0
fi

echo "testenv: building $k8s_version binaries into $dir (about 40 minutes on 2 cores when cold)"
tmp=$dir.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"

minor=$(echo "$k8s_version" | cut -d. -f2)
major=$(echo "$k8s_version" | cut -d. -f1 | tr -d v)
version_flags() { # version_flags VERSION: the ldflags that stamp a Kubernetes build with VERSION
	echo "-s -w
 -X k8s.io/component-base/version.gitVersion=$1
 -X k8s.io/component-base/version.gitMajor=$major
 -X k8s.io/component-base/version.gitMinor=$minor
 -X k8s.io/component-base/version.gitTreeState=clean
 -X k8s.io/client-go/pkg/version.gitVersion=$1
 -X k8s.io/client-go/pkg/version.gitMajor=$major
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}
ldflags=$(version_flags "$k8s_version")

(cd "$root/tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" .)
(cd "$root/tools/testenv" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubectl)
(cd "$root/tools/testenv" && CGO_ENABLED=0 go build -trimpath -ldflags "$(version_flags "$k3s_version")" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kube-proxy)
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
	"github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/ctr@$containerd_version"
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns_version"
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/rancher/local-path-provisioner@$local_path_version"

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
images
link
# Earlier builds are superseded by this recipe; each is about 750 MB.
for old in "$cache_root"/testenv/*; do
	[ "$old" = "$dir" ] || rm -rf "$old"
done
echo "testenv: built $k8s_version binaries in $dir"

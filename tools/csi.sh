#!/bin/sh
# Builds the Kubernetes CSI sidecars the lab's Longhorn stand-in (test/longhorn-standin) runs
# beside its plugin, from their Go modules in tools/csi: external-provisioner, external-attacher
# and external-resizer. Caches them outside the checkout keyed by a stamp of their recipe, and
# links the cached directory to bin/csi (the stand-in's test helpers read it). Nothing built
# here is ever linked into kip.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}
stamp=$( (cat "$root/tools/csi/go.mod" "$root/tools/csi/go.sum" "$root/tools/csi.sh"
	go env GOVERSION GOARCH) | sha256sum | cut -c1-16)
dir=$cache_root/csi/$stamp

link() {
	mkdir -p "$root/bin"
	ln -sfn "$dir" "$root/bin/csi"
}

if [ -f "$dir/.complete" ]; then
	link
	echo "csi: the CSI sidecars cached in $dir"
	exit 0
fi

echo "csi: building the CSI sidecars into $dir"
tmp=$dir.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
: >"$tmp/VERSIONS"
# build MODULE COMMAND: one sidecar, reporting its module's version (--version, its start-up log)
# as its released image does.
build() {
	v=$(cd "$root/tools/csi" && go list -m -f '{{.Version}}' "$1")
	(cd "$root/tools/csi" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$v" \
		-o "$tmp/$2" "$1/cmd/$2")
	echo "$2 $v" >>"$tmp/VERSIONS"
}
build github.com/kubernetes-csi/external-provisioner/v6 csi-provisioner
build github.com/kubernetes-csi/external-attacher/v4 csi-attacher
build github.com/kubernetes-csi/external-resizer/v2 csi-resizer

touch "$tmp/.complete"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$tmp" "$dir"
trap - EXIT
link
# Earlier builds are superseded by this recipe.
for old in "$cache_root"/csi/*; do
	[ "$old" = "$dir" ] || rm -rf "$old"
done
echo "csi: built the CSI sidecars in $dir"

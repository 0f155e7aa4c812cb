#!/bin/sh
# Builds what kip's backup tests run against, from Go modules: the Velero server (velero, from
# tools/velero at the velero pin of manifests/versions.yaml), Velero's AWS object-store plugin
# (plugins/velero-plugin-for-aws, at the velero-plugin-for-aws pin) and gofakes3, an
# S3-compatible server the tests run on loopback. Caches them outside the checkout keyed by a
# stamp of their recipe, and links the cached directory to bin/velero (test/velero reads it).
# Nothing built here is ever linked into kip.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}
gofakes3_version=v1.2.0
pin() { # pin NAME: the version of NAME in manifests/versions.yaml
	v=$(sed -n "/^  - name: $1\$/{n;s/^    version: //p;}" "$root/manifests/versions.yaml")
	[ -n "$v" ] || { echo "velero: no $1 version in manifests/versions.yaml" >&2; exit 1; }
	echo "$v"
}
velero_version=$(pin velero)
plugin_version=$(pin velero-plugin-for-aws)
mod_version=$(cd "$root/tools/velero" && go list -m -f '{{.Version}}' github.com/vmware-tanzu/velero)
if [ "$mod_version" != "$velero_version" ]; then
	echo "velero: tools/velero/go.mod has github.com/vmware-tanzu/velero $mod_version, manifests/versions.yaml pins $velero_version" >&2
	exit 1
fi

stamp=$( (cat "$root/tools/velero/go.mod" "$root/tools/velero/go.sum" "$root/tools/velero.sh"
	echo "$velero_version $plugin_version $gofakes3_version"; go env GOVERSION GOARCH) | sha256sum | cut -c1-16)
dir=$cache_root/velero/$stamp

link() {
	mkdir -p "$root/bin"
	ln -sfn "$dir" "$root/bin/velero"
}

# images builds Velero's container images (test/images -set velero: the server, node agent and
# restore helper; the AWS plugin) into $dir/images from the cached binaries, again whenever their
# recipe (test/images) changed: the backup tests import them on the lab hosts that run Velero.
images() {
	img_stamp=$(cat "$root"/test/images/*.go | sha256sum | cut -c1-16)
	if [ "$(cat "$dir/images/.stamp" 2>/dev/null)" = "$img_stamp" ]; then
		return
	fi
	rm -rf "$dir/images" "$dir/images.tmp"
	mkdir -p "$dir/images.tmp"
	(cd "$root" && go run ./test/images -set velero -bin "$dir" -busybox /bin/busybox -out "$dir/images.tmp")
	echo "$img_stamp" >"$dir/images.tmp/.stamp"
	mv "$dir/images.tmp" "$dir/images"
	echo "velero: built Velero's container images in $dir/images"
}

if [ -f "$dir/.complete" ]; then
	images
	link
	echo "velero: velero $velero_version, velero-plugin-for-aws $plugin_version and gofakes3 $gofakes3_version cached in $dir"
	exit 0
fi

echo "velero: building velero $velero_version, velero-plugin-for-aws $plugin_version and gofakes3 $gofakes3_version into $dir"
tmp=$dir.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp/plugins"

# The server reports the pinned version (`velero version`, its start-up log), as the released
# image does. controller-runtime's own metrics listener (":8080" on every interface, which the
# server gives no flag for) is turned off, so that servers of tests running in parallel do not
# fight over one port; Velero's metrics stay (--metrics-address).
(cd "$root/tools/velero" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w
 -X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=$velero_version
 -X github.com/vmware-tanzu/velero/pkg/buildinfo.GitTreeState=clean
 -X sigs.k8s.io/controller-runtime/pkg/metrics/server.DefaultBindAddress=0" \
	-o "$tmp/velero" github.com/vmware-tanzu/velero/cmd/velero)
# Velero's file-system restores run it as an init container of each restored pod.
(cd "$root/tools/velero" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
	-o "$tmp/velero-restore-helper" github.com/vmware-tanzu/velero/cmd/velero-restore-helper)
# velero server --plugin-dir takes a directory of plugin executables.
GOBIN=$tmp/plugins CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
	"github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws@$plugin_version"
GOBIN=$tmp CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
	"github.com/johannesboyne/gofakes3/cmd/gofakes3@$gofakes3_version"

printf 'velero %s\nvelero-plugin-for-aws %s\ngofakes3 %s\n' "$velero_version" "$plugin_version" "$gofakes3_version" >"$tmp/VERSIONS"
touch "$tmp/.complete"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$tmp" "$dir"
trap - EXIT
images
link
# Earlier builds are superseded by this recipe.
for old in "$cache_root"/velero/*; do
	[ "$old" = "$dir" ] || rm -rf "$old"
done
echo "velero: built velero $velero_version, velero-plugin-for-aws $plugin_version and gofakes3 $gofakes3_version in $dir"

#!/bin/sh
# testenv.sh PART: builds one part of kip's test environment from the Go modules of tools/testenv,
# one module graph for all of them (so each package is compiled once, and the modules are
# downloaded once), caches it outside the checkout keyed by a stamp of the recipe, and links the
# cached directory into bin/. Nothing built here is ever linked into kip. The parts, in the
# order make testenv builds them:
#
#   modules  downloads the Go modules of tools/testenv and of kip itself
#   control  the control plane, bin/testenv: one binary (testenv-control) that runs as
#            kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd; kwok,
#            and its stage configurations
#   node     the node components lab hosts run under the k3s stand-in, bin/testenv: one binary
#            (testenv-node) that runs as kubelet and kube-proxy, which report the k3s release,
#            containerd and ctr; containerd's runc shim, CoreDNS and the local-path provisioner;
#            and the lab's container images (images/*.tar: pause, CoreDNS, the local-path
#            provisioner, busybox; test/images)
#   velero   the backup tests' Velero server at the velero pin of manifests/versions.yaml, its
#            restore helper, its AWS object-store plugin and gofakes3, an S3-compatible server,
#            bin/velero, with Velero's container images
#   csi      the CSI sidecars of the lab's Longhorn stand-in, bin/csi: external-provisioner,
#            external-attacher and external-resizer
#   postgres the lab's PostgreSQL image (images/postgres.tar, docker.io/library/postgres:15;
#            test/images -set postgres), bin/postgres: Debian's PostgreSQL 15 from this machine's
#            packages (make test-deps installs them) with a stand-in entrypoint
#   lab      the lab hosts' base image (test/lab, cached in ~/.cache/kip/lab; make lab-image)
#
# and, not in make testenv, for the upgrade tests only (make testenv-older):
#
#   older    the older Kubernetes release the upgrade tests start from (go.older.mod:
#            v1.36.3), from the same sources as control and node: its control plane
#            (testenv-control) and its kubelet and kube-proxy (testenv-node without containerd,
#            -tags testenv_older), stamped v1.36.3 and v1.36.3+k3s1, cached in
#            ~/.cache/kip/testenv/older and linked into bin/testenv/v1.36.3, beside the other
#            programs the stand-in runs there (links to the current build's containerd, ctr,
#            runc shim and kwok). A k3s stand-in claiming v1.36.3+k3s1 runs what it finds
#            there (docs/k3s-standin.md). Run it after control and node.
#
# Each part prints whether it was cached, and writes it to the file KIP_PHASE_NOTE names
# (tools/phase.sh).
set -eu

part=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/testenv
cache_root=${KIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kip}

note() { # note TEXT: says TEXT, and records it for the run's table of timings
	echo "testenv $part: $*"
	if [ -n "${KIP_PHASE_NOTE:-}" ]; then echo "$*" >>"$KIP_PHASE_NOTE"; fi
}
pin() { # pin NAME: the version of NAME in manifests/versions.yaml
	v=$(sed -n "/^  - name: $1\$/{n;s/^    version: //p;}" "$root/manifests/versions.yaml")
	[ -n "$v" ] || { echo "testenv: no $1 version in manifests/versions.yaml" >&2; exit 1; }
	echo "$v"
}
modversion() { # modversion MODULE: MODULE's version in tools/testenv's module graph
	(cd "$mod" && go list -m -f '{{.Version}}' "$1")
}
gomodflags= # -modfile and -tags of the older release's build (part older), else none
build() { # build LDFLAGS OUT PACKAGE...: go build in tools/testenv
	ldflags=$1 out=$2
	shift 2
	(cd "$mod" && CGO_ENABLED=0 go build $gomodflags -trimpath -ldflags "-s -w $ldflags" -o "$out" "$@")
}
links() { # links DIR BINARY NAME...: DIR/NAME for each NAME, a link to DIR/BINARY
	d=$1 bin=$2
	shift 2
	for n in "$@"; do ln -sfn "$bin" "$d/$n"; done
}

# The stamp covers everything the binaries are built from; a change of any of it rebuilds them.
k3s_version=$(pin k3s)
stamp=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod"/*/*.go "$root/tools/testenv.sh"
	echo "$k3s_version"; go env GOVERSION GOARCH) | sha256sum | cut -c1-16)

# cached DIR: whether DIR was completed by this recipe; else start building it in $tmp, which
# done moves to DIR once complete.
cached() {
	dir=$1
	if [ -f "$dir/.complete" ]; then return 0; fi
	tmp=$dir.tmp.$$
	trap 'rm -rf "$tmp"' EXIT
	rm -rf "$tmp"
	mkdir -p "$tmp"
	return 1
}
done_() { # done_ KEEP: moves $tmp into place as $dir, then removes every other build in KEEP's
	# directory: earlier recipes' (a build of the control plane and node components is about
	# 750 MB), but not the older release's builds (testenv/older), which are kept apart
	touch "$tmp/.complete"
	rm -rf "$dir"
	mkdir -p "$(dirname "$dir")"
	mv "$tmp" "$dir"
	trap - EXIT
	for old in "$(dirname "$1")"/*; do
		[ "$old" = "$1" ] || [ "$old" = "$cache_root/testenv/older" ] || rm -rf "$old"
	done
}
link() { # link NAME DIR: bin/NAME points at DIR
	mkdir -p "$root/bin"
	ln -sfn "$2" "$root/bin/$1"
}

k8s_version=$(modversion k8s.io/kubernetes)
version_flags() { # version_flags VERSION: the ldflags that stamp a Kubernetes build with VERSION
	minor=$(echo "$1" | cut -d. -f2)
	major=$(echo "$1" | cut -d. -f1 | tr -d v)
	echo "-X k8s.io/component-base/version.gitVersion=$1
 -X k8s.io/component-base/version.gitMajor=$major
 -X k8s.io/component-base/version.gitMinor=$minor
 -X k8s.io/component-base/version.gitTreeState=clean
 -X k8s.io/client-go/pkg/version.gitVersion=$1
 -X k8s.io/client-go/pkg/version.gitMajor=$major
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

# testenv_dir holds the control plane and the node components (test/testenv reads bin/testenv).
testenv_dir=$cache_root/testenv/$k8s_version-$stamp

case $part in
modules)
	count() { find "$(go env GOMODCACHE)/cache/download" -name '*.zip' 2>/dev/null | wc -l; }
	before=$(count)
	(cd "$mod" && go mod download && go mod download -modfile=go.older.mod)
	(cd "$root" && go mod download)
	after=$(count)
	if [ "$after" = "$before" ]; then
		note "every module was in the module cache ($after)"
	else
		note "downloaded $((after - before)) modules ($before were in the module cache)"
	fi
	;;
control)
	if cached "$testenv_dir/control"; then
		note "cached in $testenv_dir"
	else
		echo "testenv control: building $k8s_version into $testenv_dir"
		build "$(version_flags "$k8s_version")" "$tmp/testenv-control" ./control
		links "$tmp" testenv-control kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
		build "" "$tmp/" sigs.k8s.io/kwok/cmd/kwok
		# kwok's stage configurations make its fake kubelets move Nodes and Pods through their
		# lifecycle: nodes initialise and heartbeat; pods become ready, complete and are deleted
		# at once (the "fast" set: no random delays, so tests wait on kip, not on simulated
		# kubelets).
		kwok_src=$(cd "$mod" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
		mkdir -p "$tmp/kwok-stages"
		cp "$kwok_src/node/fast/node-initialize.yaml" "$kwok_src/node/heartbeat/node-heartbeat.yaml" \
			"$kwok_src"/pod/fast/pod-*.yaml "$tmp/kwok-stages/"
		chmod -R u+w "$tmp/kwok-stages"
		done_ "$testenv_dir"
		note "built"
	fi
	# bin/testenv is the control plane's and the node components' directory, one for both.
	for n in "$testenv_dir"/control/*; do ln -sfn "control/$(basename "$n")" "$testenv_dir/$(basename "$n")"; done
	echo "$k8s_version" >"$testenv_dir/VERSION"
	link testenv "$testenv_dir"
	;;
node)
	if cached "$testenv_dir/node"; then
		note "cached in $testenv_dir"
	else
		echo "testenv node: building the node components into $testenv_dir"
		# The kubelet reports the k3s release, as k3s's own does: kip reads a node's k3s version
		# there.
		build "$(version_flags "$k3s_version")" "$tmp/testenv-node" ./node
		links "$tmp" testenv-node kubelet kube-proxy containerd ctr
		build "" "$tmp/" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/coredns/coredns
		# A build of its own: the provisioner imports logrus under its old path
		# (github.com/Sirupsen/logrus), which one build cannot hold beside the new one.
		build "" "$tmp/" github.com/rancher/local-path-provisioner
		(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/pause" ./test/images/pause)
		done_ "$testenv_dir"
		note "built"
	fi
	for n in "$testenv_dir"/node/*; do ln -sfn "node/$(basename "$n")" "$testenv_dir/$(basename "$n")"; done
	# The lab's container images, again whenever their recipe (test/images) changed: seconds,
	# not the binaries' build.
	img_stamp=$(cat "$root"/test/images/*.go "$root"/test/images/pause/*.go | sha256sum | cut -c1-16)
	if [ "$(cat "$testenv_dir/images/.stamp" 2>/dev/null)" != "$img_stamp" ]; then
		rm -rf "$testenv_dir/images" "$testenv_dir/images.tmp"
		mkdir -p "$testenv_dir/images.tmp"
		(cd "$root" && go run ./test/images -bin "$testenv_dir" -busybox /bin/busybox -out "$testenv_dir/images.tmp")
		echo "$img_stamp" >"$testenv_dir/images.tmp/.stamp"
		mv "$testenv_dir/images.tmp" "$testenv_dir/images"
		note "the lab's container images built"
	fi
	link testenv "$testenv_dir"
	;;
velero)
	velero_version=$(pin velero)
	plugin_version=$(pin velero-plugin-for-aws)
	for m in "github.com/vmware-tanzu/velero $velero_version" "github.com/vmware-tanzu/velero-plugin-for-aws $plugin_version"; do
		set -- $m
		if [ "$(modversion "$1")" != "$2" ]; then
			echo "testenv: tools/testenv/go.mod has $1 $(modversion "$1"), manifests/versions.yaml pins $2" >&2
			exit 1
		fi
	done
	gofakes3_version=$(modversion github.com/johannesboyne/gofakes3)
	dir=$cache_root/velero/$stamp
	if cached "$dir"; then
		note "cached in $dir"
	else
		echo "testenv velero: building velero $velero_version, velero-plugin-for-aws $plugin_version and gofakes3 $gofakes3_version into $dir"
		# The server reports the pinned version (`velero version`, its start-up log), as the
		# released image does. controller-runtime's own metrics listener (":8080" on every
		# interface, which the server gives no flag for) is turned off, so that servers of tests
		# running in parallel do not fight over one port; Velero's metrics stay
		# (--metrics-address).
		build "-X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=$velero_version
 -X github.com/vmware-tanzu/velero/pkg/buildinfo.GitTreeState=clean
 -X sigs.k8s.io/controller-runtime/pkg/metrics/server.DefaultBindAddress=0" "$tmp/velero" github.com/vmware-tanzu/velero/cmd/velero
		# Velero's file-system restores run it as an init container of each restored pod;
		# velero server --plugin-dir takes a directory of plugin executables.
		mkdir -p "$tmp/plugins"
		build "" "$tmp/" github.com/vmware-tanzu/velero/cmd/velero-restore-helper github.com/johannesboyne/gofakes3/cmd/gofakes3
		build "" "$tmp/plugins/" github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws
		printf 'velero %s\nvelero-plugin-for-aws %s\ngofakes3 %s\n' "$velero_version" "$plugin_version" "$gofakes3_version" >"$tmp/VERSIONS"
		done_ "$dir"
		note "built"
	fi
	# Velero's container images (test/images -set velero: the server, node agent and restore
	# helper; the AWS plugin), again whenever their recipe changed: the backup tests import them
	# on the lab hosts that run Velero.
	img_stamp=$(cat "$root"/test/images/*.go | sha256sum | cut -c1-16)
	if [ "$(cat "$dir/images/.stamp" 2>/dev/null)" != "$img_stamp" ]; then
		rm -rf "$dir/images" "$dir/images.tmp"
		mkdir -p "$dir/images.tmp"
		(cd "$root" && go run ./test/images -set velero -bin "$dir" -busybox /bin/busybox -out "$dir/images.tmp")
		echo "$img_stamp" >"$dir/images.tmp/.stamp"
		mv "$dir/images.tmp" "$dir/images"
		note "Velero's container images built"
	fi
	link velero "$dir"
	;;
csi)
	dir=$cache_root/csi/$stamp
	if cached "$dir"; then
		note "cached in $dir"
	else
		echo "testenv csi: building the CSI sidecars into $dir"
		: >"$tmp/VERSIONS"
		for s in external-provisioner/v6:csi-provisioner external-attacher/v4:csi-attacher external-resizer/v2:csi-resizer; do
			m=github.com/kubernetes-csi/${s%%:*} name=${s#*:}
			v=$(modversion "$m")
			build "-X main.version=$v" "$tmp/$name" "$m/cmd/$name"
			echo "$name $v" >>"$tmp/VERSIONS"
		done
		done_ "$dir"
		note "built"
	fi
	link csi "$dir"
	;;
postgres)
	# Built from this machine's PostgreSQL 15 and busybox, not from tools/testenv: the stamp is
	# the recipe (test/images) and the Debian packages the image's files come from.
	for p in /usr/lib/postgresql/15/bin/postgres /usr/lib/postgresql/15/bin/pg_restore; do
		[ -x "$p" ] || {
			echo "testenv postgres: $p is missing: run make test-deps (Debian's postgresql-15 and postgresql-client-15)" >&2
			exit 1
		}
	done
	pg_stamp=$( (cat "$root"/test/images/*.go "$root"/test/images/*.sh
		dpkg-query -W -f '${Package} ${Version}\n' postgresql-15 postgresql-client-15 libc6 busybox-static 2>/dev/null) | sha256sum | cut -c1-16)
	dir=$cache_root/postgres/$pg_stamp
	if cached "$dir"; then
		note "cached in $dir"
	else
		echo "testenv postgres: building the PostgreSQL $(dpkg-query -W -f '${Version}' postgresql-15) image into $dir"
		mkdir -p "$tmp/images"
		(cd "$root" && go run ./test/images -set postgres -busybox /bin/busybox -out "$tmp/images")
		dpkg-query -W -f '${Package} ${Version}\n' postgresql-15 postgresql-client-15 >"$tmp/VERSIONS"
		done_ "$dir"
		note "built ($(du -h "$dir/images/postgres.tar" | cut -f1))"
	fi
	link postgres "$dir"
	;;
lab)
	out=$(cd "$root" && go run ./test/lab/cmd/kiplab image 2>&1) || {
		echo "$out" >&2
		exit 1
	}
	echo "$out"
	case $out in
	*"built the base image"*) note "built" ;;
	*) note "cached" ;;
	esac
	;;
older)
	# The older release the upgrade tests start from: go.older.mod's k8s.io/kubernetes, its k3s
	# release the first of that Kubernetes release (+k3s1). Keyed like control and node, by a
	# stamp of what it is built from (go.older.mod instead of go.mod), in a directory of its own
	# that their builds leave alone.
	older_version=$(cd "$mod" && go list -modfile=go.older.mod -m -f '{{.Version}}' k8s.io/kubernetes)
	older_k3s=$older_version+k3s1
	older_stamp=$( (cat "$mod/go.older.mod" "$mod/go.older.sum" "$mod"/*/*.go "$root/tools/testenv.sh"
		echo "$older_k3s"; go env GOVERSION GOARCH) | sha256sum | cut -c1-16)
	dir=$cache_root/testenv/older/$older_version-$older_stamp
	if cached "$dir"; then
		note "cached in $dir"
	else
		echo "testenv older: building $older_version into $dir"
		gomodflags="-modfile=go.older.mod -tags testenv_older"
		build "$(version_flags "$older_version")" "$tmp/testenv-control" ./control
		links "$tmp" testenv-control kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
		# The kubelet reports the k3s release, as the current build's does.
		build "$(version_flags "$older_k3s")" "$tmp/testenv-node" ./node
		links "$tmp" testenv-node kubelet kube-proxy
		gomodflags=
		echo "$older_version" >"$tmp/VERSION"
		(cd "$mod" && go list -modfile=go.older.mod -m -f '{{.Path}} {{.Version}}' k8s.io/kubernetes go.etcd.io/etcd/server/v3) >"$tmp/VERSIONS"
		done_ "$dir"
		note "built ($(du -sh "$dir" | cut -f1))"
	fi
	# bin/testenv/<release>: the older build, hard links (the lab binds bin/testenv into hosts,
	# and a link out of it would point nowhere there), with links to the current build's
	# programs that do not change with the release: containerd, ctr, the runc shim, kwok.
	for p in control node; do
		[ -f "$testenv_dir/$p/.complete" ] || {
			echo "testenv older: $testenv_dir/$p is not built: run sh tools/testenv.sh $p first" >&2
			exit 1
		}
	done
	vdir=$testenv_dir/$older_version
	if [ "$(cat "$vdir/.source" 2>/dev/null)" != "$dir" ]; then
		rm -rf "$vdir" "$vdir.tmp"
		mkdir -p "$vdir.tmp"
		cp -al "$dir"/. "$vdir.tmp"/ 2>/dev/null || cp -a "$dir"/. "$vdir.tmp"/
		for n in containerd containerd-shim-runc-v2 ctr kwok kwok-stages; do ln -sfn "../$n" "$vdir.tmp/$n"; done
		echo "$dir" >"$vdir.tmp/.source"
		mv "$vdir.tmp" "$vdir"
		note "linked into $vdir"
	fi
	link testenv "$testenv_dir"
	;;
*)
	echo "usage: testenv.sh modules|control|node|velero|csi|postgres|lab|older" >&2
	exit 2
	;;
esac

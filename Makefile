# kip's build and test entry points. `make test` is the one command CI runs (.ci/run).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X kipper.run/kip/internal/buildinfo.Version=$(VERSION) -X kipper.run/kip/internal/buildinfo.Commit=$(COMMIT)
# -parallel 16: the end-to-end tests run side by side, each on its own lab hosts (test/e2e), all of
# them at once, so that the longest start first; a test powers its hosts off when it ends
# (e2e.Suite.Own), so that the ones still running have the machine.
TESTFLAGS ?= -timeout 60m -parallel 16

.PHONY: all build build-fault mover-image mover-image-pin test test-deps testenv testenv-older lint docs clean lab-image lab-up lab-status lab-down demo

all: build

## build: build bin/kip, with the data mover's image it carries (mover-image)
build: mover-image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kip ./cmd/kip

## build-fault: build bin/kip-fault, kip with its fault points (-tags kipfault: KIP_FAULT_KILL at step boundaries, KIP_FAULT_KILL_WRITE after a single write); for tests only, never shipped
build-fault: mover-image
	CGO_ENABLED=0 $(GO) build -trimpath -tags kipfault -ldflags "$(LDFLAGS)" -o bin/kip-fault ./cmd/kip

## mover-image: build the data mover's image (cmd/kip-mover, linux/amd64 and arm64) into internal/mover/moverpod/image/kip-mover-image.tar, the OCI archive kip embeds, and check its digest against manifests/mover-image.yaml
mover-image:
	$(GO) run ./internal/mover/moverimage/build -out internal/mover/moverpod/image/kip-mover-image.tar

## mover-image-pin: after a change to the data mover, write its image's new digest to manifests/mover-image.yaml
mover-image-pin:
	$(GO) run ./internal/mover/moverimage/build -pin

export GO TESTFLAGS

## test: install test dependencies, build the test environment, lint, run every test tier: the lab's own tests beside the builds, then the unit, API, SSH and end-to-end tiers and, beside them, the packages with fault-injection tests (-tags kipfault) again (tools/test.sh)
test:
	sh tools/test.sh

## test-deps: install the Debian packages the tests use (sshd, sudo, busybox-static for the lab's images, PostgreSQL 15 for its postgres image, and the lab's: systemd-nspawn, debootstrap, apt-cacher-ng, zstd, iptables)
test-deps:
	sh test/deps.sh

## testenv: build (or reuse from ~/.cache/kip) the test environment from the one module graph of tools/testenv: the control plane (kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok), the node components (kubelet, kube-proxy, containerd, CoreDNS, the local-path provisioner) with the lab's container images, the Velero server, its AWS plugin and gofakes3 (S3) for the backup tests, the CSI sidecars of the lab's Longhorn stand-in, and the lab's PostgreSQL image (docker.io/library/postgres:15 from Debian's PostgreSQL 15, with a stand-in entrypoint)
testenv:
	for part in modules control node velero csi postgres; do sh tools/testenv.sh $$part || exit 1; done

## testenv-older: build (or reuse from ~/.cache/kip/testenv/older) the older Kubernetes release the upgrade tests start from (tools/testenv/go.older.mod, v1.36.3) from the same sources: its control plane, kubelet and kube-proxy, stamped v1.36.3 and v1.36.3+k3s1, into bin/testenv/v1.36.3, where a k3s stand-in claiming v1.36.3+k3s1 runs them (make k3s-standin-older); after make testenv, and not part of it
testenv-older:
	sh tools/testenv.sh older

## lab-image: build (or reuse from ~/.cache/kip/lab) the lab hosts' base image
lab-image: test-deps
	sh tools/testenv.sh lab

## lab-up: bring up N lab hosts (make lab-up N=3), up until make lab-down; see docs/lab.md
N ?= 3
lab-up: test-deps
	$(GO) run ./test/lab/cmd/kiplab up $(N)

## lab-status: list the lab's hosts and how to reach them
lab-status:
	$(GO) run ./test/lab/cmd/kiplab status

## lab-down: remove the lab's hosts, bridges and apt-cacher-ng (the image and apt caches stay)
lab-down:
	$(GO) run ./test/lab/cmd/kiplab down

## demo: one lab host, the real kip install through the airgap path (k3s is the test stand-in), then kip status and kip doctor; KEEP=1 keeps the host
demo: test-deps testenv build k3s-standin
	$(GO) run ./test/demo

# FAULT_PKGS are the packages with files built only with -tags kipfault: vet looks at them again
# with the tag (every package is compiled with it by make build-fault, which the end-to-end tests
# run, and the fault-injection tests).
FAULT_PKGS = $(sort $(patsubst %/,./%,$(dir $(shell grep -rl --include='*.go' '^//go:build.*kipfault' cmd internal test 2>/dev/null))))

## lint: formatting, vet, shell syntax of embedded scripts, no tracked file over 1 MiB or executable binary
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags kipfault $(FAULT_PKGS)
	@for f in $$(git ls-files '*.sh' .ci/run 2>/dev/null); do sh -n "$$f" || exit 1; done
	sh tools/check-tree.sh

## docs: regenerate the CLI reference in docs/cli from the commands
docs:
	$(GO) test ./cmd/kip -run TestCLIReference -update

clean:
	rm -rf bin

## k3s-standin: build bin/k3s-standin (the test lab's stand-in for k3s, never part of kip) and bin/k3s-standin.sha256
## K3S_STANDIN_VERSION=v1.36.3+k3s1 sets the k3s version it reports (default: the k3s pin in manifests/versions.yaml)
K3S_STANDIN_VERSION ?=
.PHONY: k3s-standin
k3s-standin:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.commit=$(COMMIT) $(if $(K3S_STANDIN_VERSION),-X main.version=$(K3S_STANDIN_VERSION))" -o bin/k3s-standin ./test/k3s-standin
	cd bin && sha256sum k3s-standin > k3s-standin.sha256

## k3s-standin-older: build bin/k3s-standin-<release> claiming the k3s release of the older Kubernetes (v1.36.3+k3s1: tools/testenv/go.older.mod's; it runs bin/testenv/v1.36.3, make testenv-older), and its .sha256 (e2e.StandinBundle lays it out as an airgap bundle)
OLDER_K8S = $(shell sed -n 's/^\tk8s.io\/kubernetes \(v[0-9.]*\)$$/\1/p' tools/testenv/go.older.mod)
.PHONY: k3s-standin-older
k3s-standin-older:
	@test -n "$(OLDER_K8S)" || { echo "no k8s.io/kubernetes requirement in tools/testenv/go.older.mod" >&2; exit 1; }
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.commit=$(COMMIT) -X main.version=$(OLDER_K8S)+k3s1" -o bin/k3s-standin-$(OLDER_K8S) ./test/k3s-standin
	cd bin && sha256sum k3s-standin-$(OLDER_K8S) > k3s-standin-$(OLDER_K8S).sha256

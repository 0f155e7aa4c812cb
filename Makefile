# kip's build and test entry points. `make test` is the one command CI runs (.ci/run).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X kipper.run/kip/internal/buildinfo.Version=$(VERSION) -X kipper.run/kip/internal/buildinfo.Commit=$(COMMIT)
TESTFLAGS ?= -timeout 40m

.PHONY: all build test test-deps testenv lint docs clean

all: build

## build: build bin/kip
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kip ./cmd/kip

## test: install test dependencies, build the test environment, lint, run every test tier
test: test-deps testenv lint
	$(GO) test $(TESTFLAGS) ./...

## test-deps: install the Debian packages the tests use (openssh-server, sudo)
test-deps:
	sh test/deps.sh

## testenv: build (or reuse from ~/.cache/kip) kube-apiserver, controller-manager, scheduler, etcd, kwok
testenv:
	sh tools/testenv.sh

## lint: formatting, vet, shell syntax of embedded scripts
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@for f in $$(git ls-files '*.sh' .ci/run 2>/dev/null); do sh -n "$$f" || exit 1; done

## docs: regenerate the CLI reference in docs/cli from the commands
docs:
	$(GO) test ./cmd/kip -run TestCLIReference -update

clean:
	rm -rf bin

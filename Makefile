# exn build and test entry points. `make` builds bin/; `make test` is the
# README's test command (it installs the Debian packages the tests need when
# run as root and they are missing).
GO      ?= go
BIN     := bin
CC      ?= gcc
PKGS    := iperf3 sockperf iproute2 iputils-ping gcc procps libfabric-dev

.PHONY: all build test deps fmt-check vet unit race clean demo fuzz ofi bench-ofi

all: build

build:
	mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...
	@if [ -f shim/libextds.c ]; then $(CC) -O2 -fPIC -shared -Wall -Werror -o $(BIN)/libextds.so shim/libextds.c -ldl; fi

demo:
	$(GO) run ./cmd/exnperf

deps:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing packages (privileged tests will skip):$$missing"; fi; \
	fi

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# The race detector runs on the packages whose concurrency matters most,
# with small sizes (EXN_TEST_SMALL=1); the full suite runs without it.
race:
	EXN_TEST_SMALL=1 $(GO) test -race -count=1 -timeout 20m ./fabric/... ./exn/... ./arp/...

unit:
	$(GO) test -count=1 -timeout 40m ./...

fuzz:
	.ci/fuzz

# The libfabric backend (build tag ofi, cgo): its conformance suite on the
# tcp and shm providers, the backend selector, and EXT-Eth over ofi:tcp in
# network namespaces.
ofi:
	$(GO) vet -tags ofi ./fabric/... ./integration/...
	$(GO) test -tags ofi -count=1 -timeout 10m ./fabric/ofi/ ./fabric/backend/
	$(GO) test -tags ofi -count=1 -timeout 10m -run 'TestOFI' ./integration/

# exn's ofi VELO ping-pong (two processes) against libfabric's fi_pingpong
# (libfabric-bin) on shm and tcp, in the same run, under the shared
# benchmark lock: one line per provider, "ofi:<prov> exn p50 X us;
# fi_pingpong Y us; ratio R" (docs/fabric-ofi.md).
bench-ofi:
	@command -v fi_pingpong >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric-bin libfabric-dev; }
	flock /tmp/exn-bench.lock perf/bench-ofi.sh

test: deps fmt-check vet build race unit ofi fuzz

clean:
	rm -rf $(BIN)

# exn build and test entry points. `make` builds bin/; `make test` is the
# README's test command (it installs the Debian packages the tests need when
# run as root and they are missing).
GO      ?= go
BIN     := bin
CC      ?= gcc
PKGS    := iperf3 sockperf iproute2 iputils-ping gcc make procps libfabric-dev
# netperf (issue #15) is not packaged here: its source sits beside the
# checkout (../shared/tools/netperf, override with NETPERF_SRC=...) and is
# built into NETPERF_DIR, an ignored cache the integration tests read
# through EXN_NETPERF_DIR.
NETPERF_SRC ?= ../shared/tools/netperf
NETPERF_DIR ?= build/netperf
export EXN_NETPERF_DIR := $(abspath $(NETPERF_DIR))
# exnd speaks libfabric (--fabric ofi:PROVIDER, real RDMA NICs) whenever
# libfabric's headers are installed: `make` then builds cmd/ with the ofi
# build tag, so nobody has to know about it. Without them the binaries
# build as before and exnd answers ofi: specs with the reason.
OFI_TAG ?= $(shell printf '\043include <rdma/fabric.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo ofi)

.PHONY: all build test deps fmt-check vet unit race clean demo fuzz ofi netperf bench-ofi

all: build

build:
	mkdir -p $(BIN)
	$(GO) build -tags '$(OFI_TAG)' -o $(BIN)/ ./cmd/...
	$(MAKE) -s -C shim OUT=$(abspath $(BIN))/libextds.so CC=$(CC)
	$(CC) -O2 -fPIC -shared -std=gnu11 -Wall -Wextra -Werror -o $(BIN)/libshmfab.so fabric/shm/cabi/shmfab*.c

demo:
	$(GO) run ./cmd/exnperf

deps:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing packages (privileged tests will skip):$$missing"; fi; \
	fi

# netperf and netserver for the integration tests (TestNetperf*). The
# build script is idempotent (nothing to do while the binaries are newer
# than its tarball). A missing source or a failed build does not stop
# `make test`: the netperf tests then skip with the reason, or fail under
# EXN_REQUIRE_PRIVILEGED=1 as CI sets it.
netperf:
	@if [ -x "$(NETPERF_SRC)/build.sh" ]; then \
	  "$(NETPERF_SRC)/build.sh" "$(NETPERF_DIR)" || echo "netperf: build failed; the netperf tests will skip (fail under EXN_REQUIRE_PRIVILEGED=1)"; \
	else echo "netperf: no $(NETPERF_SRC)/build.sh (set NETPERF_SRC); the netperf tests will skip"; fi

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# The race detector runs on the packages whose concurrency matters most,
# with small sizes (EXN_TEST_SMALL=1); the full suite runs without it.
race:
	EXN_TEST_SMALL=1 $(GO) test -race -count=1 -timeout 20m ./fabric/... ./exn/... ./arp/... ./extds/... ./control/... ./shim/check/

unit:
	$(GO) test -count=1 -timeout 40m ./...

fuzz:
	.ci/fuzz

# The libfabric backend (build tag ofi, cgo): its conformance suite on the
# tcp and shm providers, the backend selector, and EXT-Eth over ofi:tcp in
# network namespaces; the raw libfabric loop that perf/ofi-exn0.sh
# measures exn against.
ofi:
	$(GO) vet -tags ofi ./fabric/... ./integration/... ./perf/
	$(GO) test -tags ofi -count=1 -timeout 10m ./fabric/ofi/ ./fabric/backend/
	$(GO) test -tags ofi -count=1 -timeout 5m -run 'TestOFIRawBW' ./perf/
	$(GO) test -tags ofi -count=1 -timeout 10m -run 'TestOFI' ./integration/

test: deps fmt-check vet build netperf race unit ofi fuzz

# exn's ofi VELO ping-pong (two processes) against libfabric's fi_pingpong
# (libfabric-bin) on shm and tcp, in the same run, under the shared
# benchmark lock: one line per provider, "ofi:<prov> exn p50 X us;
# fi_pingpong Y us; ratio R" (docs/fabric-ofi.md).
bench-ofi:
	@command -v fi_pingpong >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric-bin libfabric-dev; }
	flock /tmp/exn-bench.lock perf/bench-ofi.sh

clean:
	rm -rf $(BIN) build

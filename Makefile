# Every target builds the .venv it needs, so a fresh machine with python3, pip and make suffices.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_STAMP := $(VENV)/.lint-installed

.PHONY: test test-slow fuzz demo demo-dra lint bench bench-reference protos image image-dra e2e compat cluster-images cluster cluster-down e2e-cluster e2e-cluster-matrix bench-cluster clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,lint]'
	touch $(LINT_STAMP)

# The package's bytecode, written as pip writes it for an installed package: the editable install
# has none, and with PYTHONDONTWRITEBYTECODE set (as here) every start would compile every module
# again (more than half of serve's start-up). Only changed files are compiled again.
BYTECODE := $(PY) -m compileall -q deviceplugin >/dev/null

# The simulated libnvidia-ml.so.1 (deviceplugin/sim/native/) is built first, with gcc against the
# pinned nvml.h, and cached under ~/.cache/deviceplugin/nvml-sim/ by a hash of its sources.
# Three suites (tests/suites.py), on every core (pytest-xdist); `.ci/run` runs all three, a bare
# `pytest` runs everything at once:
# - `make test`: every test but the slow and fuzz ones; Hypothesis tests with 10 examples each,
#   the libFuzzer corpus replayed (not fuzzed). It ends by listing what it left to the others.
# - `make test-slow`: the tests marked `slow`, and every Hypothesis test with all its examples.
# - `make fuzz`: the tests marked `fuzz` (libFuzzer campaigns; clang installed when missing).
# A new test that takes seconds (daemons in processes, a long campaign) is marked
# `@pytest.mark.slow` or `@pytest.mark.fuzz` (or a module's `pytestmark = pytest.mark.slow`);
# a Hypothesis test is found by itself.
# Each module runs whole on one worker (--dist loadscope): its module fixtures are made once,
# and its tests run in file order, as with a bare `pytest`.
SIM_LIBRARY := $(PY) -m deviceplugin.sim.libbuild >/dev/null
PYTEST := $(PY) -m pytest -n auto --dist loadscope

test: $(STAMP)
	$(BYTECODE)
	$(SIM_LIBRARY)
	$(PYTEST) --suite quick

test-slow: $(STAMP)
	$(BYTECODE)
	$(SIM_LIBRARY)
	$(PYTEST) --suite slow

fuzz: $(STAMP)
	$(BYTECODE)
	$(SIM_LIBRARY)
	$(PYTEST) --suite fuzz

demo: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/deviceplugin demo

# The DRA driver on a simulated node: registration, slices, a prepared claim, an Xid, SIGTERM.
demo-dra: $(STAMP)
	$(VENV)/bin/deviceplugin dra demo

# The Helm chart is linted, rendered and validated too (e2e/helm/check-chart.sh), with Helm built
# once from the Go module proxy (e2e/helm/build.sh: needs Go; cached outside the clone).
lint: $(LINT_STAMP)
	$(PY) -m ruff check deviceplugin tests bench e2e testbed
	$(PY) -m ruff format --check deviceplugin tests bench e2e testbed
	$(PY) -m mypy
	$(PY) -m mypy --strict e2e
	$(PY) -m mypy --strict bench
	$(PY) -m mypy --strict testbed
	$(VENV)/bin/yamllint -s .yamllint.yaml manifests $(wildcard config)
	$(VENV)/bin/kubernetes-validate --strict --quiet -k 1.30.0 -k 1.31.0 -k 1.32.0 -k 1.33.0 manifests/*.yaml manifests/variants/*.yaml
	$(VENV)/bin/kubernetes-validate --strict --quiet -k 1.34.0 -k 1.35.0 -k 1.36.0 -k 1.37.0 manifests/*.yaml manifests/variants/*.yaml manifests/dra/*.yaml
	$(VENV)/bin/hadolint Dockerfile
	e2e/helm/check-chart.sh $(VENV)/bin/kubernetes-validate

bench: $(STAMP)
	$(PY) -m bench

# NVIDIA's reference device plugin v0.19.0 and ours in one run, on the same simulated node against
# the same kubelet emulator: one table, ours ÷ reference (bench/reference.py; docs/performance.md,
# "Against the reference plugin"; about 45 s). Then NVIDIA's DRA kubelet plugin v0.4.1 and `dra
# serve`, against the plugin-watcher emulator and the API-server stand-in: a second table
# (bench/drareference.py; about 40 s). Root: NVIDIA's binaries run in a mount namespace. Needs Go
# and gcc to build them once, as `make compat` does.
bench-reference: $(STAMP)
	@if [ "$$(id -u)" -ne 0 ]; then echo "make bench-reference needs root (mount namespaces): sudo make bench-reference" >&2; exit 2; fi
	$(BYTECODE)
	$(PY) -m deviceplugin.sim.libbuild >/dev/null
	$(PY) -m bench.reference

# The container image, built from wheels made here (image/build.sh): works with no index or
# registry reachable from the build. The first of podman and docker found, unless CONTAINER_TOOL.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CONTAINER_TOOL ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
BASE_IMAGE ?= python:3.11-slim
IMAGE ?= deviceplugin:$(VERSION)

DRA_IMAGE ?= deviceplugin:$(VERSION)-dra

image: $(STAMP)
	image/build.sh $(CONTAINER_TOOL) $(BASE_IMAGE) $(IMAGE) $(VERSION) $(PY)

# The DRA driver's image (manifests/dra/): the same, with the Kubernetes client (extra `dra`).
image-dra: $(STAMP)
	image/build.sh $(CONTAINER_TOOL) $(BASE_IMAGE) $(DRA_IMAGE) $(VERSION) $(PY) '[dra]'

# Host packages: every target below installs those it needs that are missing, before it needs
# them (e2e/host-packages.txt lists them by group with the reason for each; e2e/host-packages.sh).
#
# End to end with a real runtime (root, podman): prepares this host (e2e/setup-host.sh installs
# podman and runc when missing, configures them, makes a local Debian base and a busybox image
# with mmdebstrap, cached), builds the image from that base, then runs e2e/: the plugin's own
# container as manifests/ run it, and podman workloads started from Allocate's answers.
E2E_BASE_IMAGE ?= localhost/deviceplugin-e2e-base:bookworm
E2E_IMAGE ?= localhost/deviceplugin:e2e

e2e: $(STAMP)
	@if [ "$$(id -u)" -ne 0 ]; then echo "make e2e needs root (podman, mknod, mount namespaces): sudo make e2e" >&2; exit 2; fi
	E2E_BASE_IMAGE=$(E2E_BASE_IMAGE) e2e/setup-host.sh
	$(MAKE) image BASE_IMAGE=$(E2E_BASE_IMAGE) IMAGE=$(E2E_IMAGE)
	IMAGE=$(E2E_IMAGE) E2E_BASE_IMAGE=$(E2E_BASE_IMAGE) $(PY) -m pytest -p no:cacheprovider -v --ignore=e2e/cluster e2e

# NVIDIA's reference device plugin v0.19.0 as the oracle (docs/compatibility.md): both plugins on
# the same simulated node with the same config, compared field by field over the whole matrix
# (about 3 min; `make e2e` runs a subset). Root: the reference runs in a mount namespace. Needs
# Go and gcc to build NVIDIA's binaries once (e2e/reference/build.sh; cached outside the clone).
compat: $(STAMP)
	@if [ "$$(id -u)" -ne 0 ]; then echo "make compat needs root (mount namespaces): sudo make compat" >&2; exit 2; fi
	$(BYTECODE)
	$(PY) -m deviceplugin.sim.libbuild >/dev/null
	$(PY) -m e2e.reference.compat

# A real single-node Kubernetes cluster built from source (e2e/cluster/: Go 1.26, root; the
# build is cached outside the clone, per version). `make cluster` brings it up with the plugin's
# images imported, `make cluster-down` removes it; `make e2e-cluster` runs the scenarios in
# between. KUBERNETES_VERSION picks a pinned minor (1.34, 1.35, 1.36; empty: 1.37, the default,
# docs/cluster.md); FEATURE_GATES=A=true,B=false is optional (empty: the version's defaults).
# NODES=2 adds a second node in a mount namespace of its own, simulating NODE2_PRESET (empty:
# a10-x8); `make e2e-cluster NODES=2` then runs e2e/cluster/test_two_nodes.py (docs/cluster.md,
# "Two nodes").
KUBERNETES_VERSION ?=
FEATURE_GATES ?=
NODES ?=
NODE2_PRESET ?=
E2E_DRA_IMAGE ?= localhost/deviceplugin:e2e-dra
E2E_BUSYBOX_IMAGE ?= localhost/deviceplugin-e2e-busybox:latest
# NVIDIA's reference plugin, unmodified, beside ours on the real node (e2e/reference/image.sh).
E2E_REFERENCE_IMAGE ?= localhost/nvidia-device-plugin:v0.19.0

cluster-images: $(STAMP)
	@if [ "$$(id -u)" -ne 0 ]; then echo "the cluster needs root: sudo make $@" >&2; exit 2; fi
	E2E_BASE_IMAGE=$(E2E_BASE_IMAGE) e2e/setup-host.sh
	$(MAKE) image BASE_IMAGE=$(E2E_BASE_IMAGE) IMAGE=$(E2E_IMAGE)
	$(MAKE) image-dra BASE_IMAGE=$(E2E_BASE_IMAGE) DRA_IMAGE=$(E2E_DRA_IMAGE)
	e2e/reference/image.sh $(E2E_BASE_IMAGE) $(E2E_REFERENCE_IMAGE)
	e2e/cluster/save-images.sh $(E2E_IMAGE) $(E2E_DRA_IMAGE) $(E2E_BUSYBOX_IMAGE) $(E2E_REFERENCE_IMAGE)

cluster: $(STAMP)
	KUBERNETES_VERSION=$(KUBERNETES_VERSION) FEATURE_GATES=$(FEATURE_GATES) NODES=$(NODES) \
		NODE2_PRESET=$(NODE2_PRESET) e2e/cluster/cluster up

cluster-down:
	e2e/cluster/cluster down

# The real scheduler at scale on the running cluster (bench/cluster.py): 200 DRA claims over 20
# nodes against 200 device-plugin pods on the real node, in one run.
bench-cluster: $(STAMP)
	e2e/host-packages.sh node
	$(PY) -m bench.cluster

e2e-cluster: cluster
	E2E_IMAGE=$(E2E_IMAGE) E2E_DRA_IMAGE=$(E2E_DRA_IMAGE) $(PY) -m pytest -p no:cacheprovider -v e2e/cluster; \
		status=$$?; e2e/cluster/cluster down; exit $$status

# `make e2e-cluster` on each pinned version in turn (e2e/cluster/matrix.py); each one's exit
# status, time and what its scenarios saw of each gated feature land in e2e/cluster/run/matrix.json
# (`$(PY) -m e2e.cluster.matrix --table` prints the table of docs/dra/versions.md).
e2e-cluster-matrix: $(STAMP)
	$(PY) -m e2e.cluster.matrix

# Regenerate the committed gRPC stubs from protos/ (tests check they match).
protos: $(STAMP)
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) build *.egg-info

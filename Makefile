# kubeinfer: `make demo` and `make test` work on a fresh machine; each sets itself up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-demo test-lifecycle lint bench crds clean mutate lock images \
	native-test native-lint dataplane native-test-python

# The virtual environment is rebuilt only when the dependencies change, at the versions
# the images ship (requirements/constraints.txt; `make lock` after editing pyproject.toml).
$(STAMP): pyproject.toml requirements/constraints.txt requirements/build.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements/build.txt
	$(BIN)/pip install --quiet --no-build-isolation -c requirements/constraints.txt -e '.[dev]'
	touch $@

# The Rust data plane as the Python extension kubeinfer_dataplane (runtime/native/crates/
# python: what `kubeinfer serve` serves through), built by maturin (requirements/build.txt)
# into the venv, again whenever a source of runtime/native changed. Cargo fetches the crates
# Cargo.lock pins on the first build (from the host's network, before any test runs).
DATAPLANE     := $(VENV)/.dataplane
DATAPLANE_SRC := $(shell find runtime/native -path runtime/native/target -prune -o -type f \
	\( -name '*.rs' -o -name '*.py' -o -name '*.toml' -o -name Cargo.lock \) -print)

# maturin runs from the crate's folder: at the repository's root, the Python it asks about
# itself would import the folder operator/ in place of the standard library's operator.
$(DATAPLANE): $(STAMP) $(DATAPLANE_SRC)
	cd runtime/native/crates/python && VIRTUAL_ENV=$(abspath $(VENV)) \
		$(abspath $(BIN))/maturin develop --quiet --release --locked
	touch $@

dataplane: $(DATAPLANE)

# The pins (docs/images.md): one resolution of every extra but gpu, for Python 3.11 on
# Debian 12's glibc, constrains the venv; each image's lock is its share of it, with
# hashes; the GPU image's is for its base's Python 3.12 on Ubuntu 24.04. `make lock` keeps
# the pins that still satisfy pyproject.toml; `make lock LOCK_ARGS=--upgrade` moves them.
LOCK_ARGS ?=
LOCK := $(BIN)/uv pip compile --quiet --custom-compile-command 'make lock' $(LOCK_ARGS)
DEBIAN_311 := --python-version 3.11 --python-platform x86_64-manylinux_2_36
PINNED := --generate-hashes -c requirements/constraints.txt

lock: $(STAMP)
	$(LOCK) $(DEBIAN_311) pyproject.toml --extra dev --extra s3 --extra gcs --extra mutation \
		-o requirements/constraints.txt
	$(LOCK) $(DEBIAN_311) $(PINNED) requirements/build.in -o requirements/build.txt
	$(LOCK) $(DEBIAN_311) $(PINNED) pyproject.toml --extra operator -o requirements/operator.txt
	$(LOCK) $(DEBIAN_311) $(PINNED) pyproject.toml --extra runtime --extra s3 --extra gcs \
		--extra extensions -o requirements/runtime.txt
	$(LOCK) --python-version 3.12 --python-platform x86_64-manylinux_2_39 $(PINNED) \
		pyproject.toml requirements/runtime-gpu.in --extra runtime --extra s3 --extra gcs \
		--extra extensions -o requirements/runtime-gpu.txt

# The operator and runtime images (docs/images.md), built with podman from the Dockerfile
# and exported as OCI archives under $${XDG_CACHE_HOME:-~/.cache}/kubeinfer/images.
images: $(STAMP)
	$(BIN)/python -m kubeinfer.cluster.images

# MLServer, the benchmark's baseline, gets its own venv: mlserver 1.7.1's pins conflict
# with ours (and it needs uvloop 0.21). Same ONNX Runtime version as .venv, for fairness.
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS  ?=

$(BENCH_STAMP): | $(STAMP)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet "mlserver==1.7.1" "uvloop==0.21.0" numpy \
		"onnxruntime==$$($(BIN)/python -c 'import onnxruntime; print(onnxruntime.__version__)')"
	touch $@

# perf_analyzer, Triton's load generator: `kubeinfer tune` and the benchmarks drive their
# load with it. Its package (the tune extra) needs glibc 2.38; on Debian 12 the same
# program comes from tritonclient 2.51.0's wheel, with libcudart beside it and libb64 from
# Debian (requirements/perf-analyzer.txt), behind a wrapper in the venv's bin that
# `kubeinfer tune` finds there.
PERF_ANALYZER := $(BIN)/perf_analyzer

$(PERF_ANALYZER): requirements/perf-analyzer.txt | $(STAMP)
	@[ -e /usr/lib/x86_64-linux-gnu/libb64.so.0d ] || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null && { apt-get install -y --no-install-recommends \
		libb64-0d >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y \
		--no-install-recommends libb64-0d >/dev/null 2>&1; }; }; } \
		|| echo "libb64-0d not installed: perf_analyzer will not start without it"
	$(BIN)/pip install --quiet --no-deps --require-hashes --upgrade \
		--target $(VENV)/perf-analyzer -r requirements/perf-analyzer.txt
	printf '%s\n' '#!/bin/sh' 'here="$$(dirname "$$0")/../perf-analyzer"' \
		'LD_LIBRARY_PATH="$$here/nvidia/cuda_runtime/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \' \
		'  exec "$$here/bin/perf_analyzer" "$$@"' > $@
	chmod +x $@

# The serving benchmark (a script, not a test); `make bench BENCH_ARGS=--quick` for a
# short run. Results also go to .bench/results.md.
bench: $(STAMP) $(BENCH_STAMP) $(PERF_ANALYZER)
	$(BIN)/python tests/benchmarks/bench_serving.py $(BENCH_ARGS)

# The story through the operator on a local cluster; it writes under
# $${XDG_STATE_HOME:-~/.local/state}/kubeinfer/demo (it says so first), wherever the clone is.
demo: $(STAMP) $(DATAPLANE)
	$(BIN)/kubeinfer demo

# The real-Prometheus tests need Debian's prometheus: installed here when missing and we
# are root with apt-get; never fatal (without it those tests skip, or fail under CI=true).
# The operator's tests run on a real control plane: its binaries (kube-apiserver, etcd,
# kube-controller-manager, kubectl), and helm for the chart's, are built from their Go
# modules once per machine and cached (`kubeinfer cluster build`, with progress); a failed
# build stops here, saying why.
# What tests need from package registries (a Go module, an npm package) is fetched next,
# from the host's network, with progress (tests/support/registry_prefetch.py): pytest then
# runs with every registry off, so no test downloads anything, on any machine.
# Two workers (pytest-xdist), a test file per worker at a time: most tests wait on real
# processes (a control plane, Prometheus, runtimes), so two share two cores well. Each
# worker starts its own control plane and Prometheus; `TEST_WORKERS=0` runs in one process.
TEST_WORKERS ?= 2

# The Rust data plane (runtime/native, docs/architecture.md): its crates' tests, and
# rustfmt and clippy with warnings as errors. Cargo fetches the crates Cargo.lock pins on
# the first run (from the host's network, before pytest switches registries off).
CARGO        ?= cargo
NATIVE       := --manifest-path runtime/native/Cargo.toml
NATIVE_FLAGS := --locked
# The extension's crate embeds the venv's Python (PyO3): its build asks that Python, and
# its tests need numpy from the venv.
WITH_PYTHON  := PYO3_PYTHON=$(abspath $(BIN))/python \
	PYTHONPATH=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

native-test:
	$(CARGO) test $(NATIVE) -p kubeinfer-dataplane-core -p kubeinfer-dataplane-server \
		$(NATIVE_FLAGS)

native-test-python: $(STAMP)
	$(WITH_PYTHON) $(CARGO) test $(NATIVE) -p kubeinfer-dataplane $(NATIVE_FLAGS)

native-lint: $(STAMP)
	$(CARGO) fmt $(NATIVE) --all --check
	$(WITH_PYTHON) $(CARGO) clippy $(NATIVE) --workspace $(NATIVE_FLAGS) --all-targets \
		-- -D warnings

test: $(STAMP) $(PERF_ANALYZER) $(DATAPLANE) native-test native-test-python
	@# Debian packages the tests run (a real Prometheus; qemu-user for other CPUs' kernels)
	@for need in prometheus:prometheus qemu-x86_64:qemu-user; do \
		command -v $${need%%:*} >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& echo "installing $${need#*:} (Debian)" \
		&& { apt-get install -y --no-install-recommends $${need#*:} >/dev/null 2>&1 \
		|| { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends \
		$${need#*:} >/dev/null 2>&1; }; }; } || echo "$${need#*:} not installed: its tests will skip"; \
	done
	$(BIN)/kubeinfer cluster build
	$(BIN)/python tests/support/registry_prefetch.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The lifecycles: `kubeinfer up` (detached and in the foreground) and `kubeinfer cluster
# up`/`down`, each on a cluster of its own, the simulated GPU fleets (KWOK nodes: mixed
# products, drains, lost nodes and zones), leader election (replicas taking over from each
# other), the Helm release installed, upgraded and removed, and the images built from a
# clean clone. Apart from `make test` for its time, as the demo's story is; CI runs both.
test-lifecycle: $(STAMP) $(DATAPLANE)
	$(BIN)/kubeinfer cluster build
	$(BIN)/python tests/support/registry_prefetch.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m lifecycle

# `make demo`'s whole story, checked: every step passed, nothing left running. Apart from
# `make test` to keep the suite under ten minutes on two cores; CI runs both.
test-demo: $(STAMP) $(DATAPLANE)
	$(BIN)/kubeinfer cluster build
	$(BIN)/python -m pytest -q -m demo tests/test_demo.py

# Types: strict on the contract and the pure cores (every decision of the operator; the
# batcher's are Rust, runtime/native/crates/core), then the default checks on every source package, through
# a tree of links that gives mypy the import names.
STRICT_TYPED := kubeinfer/contract kubeinfer/operator/api kubeinfer/operator/state \
	kubeinfer/operator/reconcile kubeinfer/operator/rollout kubeinfer/operator/scaling \
	kubeinfer/operator/quality kubeinfer/runtime/engines/dimensions.py \
	kubeinfer/runtime/known_answers/probe_file.py \
	kubeinfer/cli/tune/frontier.py kubeinfer/cli/tune/traffic.py kubeinfer/cli/tune/report.py
TYPED := kubeinfer/operator kubeinfer/runtime kubeinfer/cluster kubeinfer/cli kubeinfer/contract

lint: $(STAMP) native-lint
	$(BIN)/ruff check operator runtime contract cluster cli tests examples
	$(BIN)/ruff format --check operator runtime contract cluster cli tests examples
	$(BIN)/lint-imports
	@mkdir -p .typecheck/kubeinfer
	@for package in operator runtime contract cluster cli; do \
		ln -sfn ../../$$package .typecheck/kubeinfer/$$package; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml --strict \
		--explicit-package-bases $(STRICT_TYPED)
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml \
		--explicit-package-bases $(TYPED)

# Mutation testing of the pure Python cores (reconcile, shadow verdict, autoscaler)
# with mutmut, in .mutmut/; about an hour on 2 cores. Prints the survivors.
mutate: $(STAMP)
	$(BIN)/pip install --quiet -e '.[mutation]'
	$(BIN)/python tests/mutation/run_mutmut.py

crds: $(STAMP)
	$(BIN)/kubeinfer crds --write

clean:
	rm -rf $(VENV) .bench .mutmut build *.egg-info

# The GPU code's check, on a CUDA machine (no venv: the machine's own Python, with PyTorch
# and CuPy on GPU images): builds pycuda where missing, runs the gpu tests and the slot
# benchmark, prints one table. Offline: make gpu-check GPU_WHEELS=.whl (see the script).
.PHONY: gpu-check
gpu-check:
	$(PYTHON) tests/benchmarks/gpu_check.py

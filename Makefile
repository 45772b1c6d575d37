# dlc: the two commands a newcomer needs are `make run` and `make test`.
# Each installs what is missing first and is quick when nothing is.

LLVM_PREFIX ?= /usr/lib/llvm-22
DEBIAN_PACKAGES := llvm-22-dev libmlir-22-dev mlir-22-tools libpolly-22-dev libclang-22-dev zlib1g-dev libzstd-dev gcc binutils libgomp1 python3-venv \
	libopenmpi-dev openmpi-bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CARGO ?= cargo
EXAMPLE ?= examples/w2_mlp.dl

.PHONY: all setup setup-test-tools setup-cuda setup-onnx setup-python python-test bench-python run test lint fuzz-smoke bench bench-gpu gpu-check-prepare gpu-train-check-prepare bench-peers bench-contract bench-saturate train-peers bench-train bench-distributed \
	onnx-tests onnx-bench onnx-layers onnx-profile onnx-models setup-onnx-torch onnx-torch-models clean

all: test

# LLVM and MLIR 22 from Debian: mlir-opt checks our --mlir-generic output, the
# code generator links LLVM, compiler/mlir links MLIR (melior, whose bindings
# bindgen makes with libclang). gcc links shared libraries (--emit so) and the
# C test program, binutils' ar writes static ones (--emit lib); libgomp is the
# thread pool kernels run on; python3-venv holds the pinned Python packages
# (ptxas for the GPU tests, onnx and onnxruntime for the ONNX tools). Open MPI
# (its library, headers and mpirun) carries `dlc train --data-parallel`'s
# gradients between processes; the `mpi` crate finds it with `mpicc -show`.
setup:
	@if [ ! -x $(LLVM_PREFIX)/bin/mlir-opt ] || [ ! -x $(LLVM_PREFIX)/bin/llvm-config ] || \
	   [ ! -e $(LLVM_PREFIX)/lib/libclang.so ] || \
	   ! command -v cc >/dev/null || ! command -v ar >/dev/null || \
	   ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || \
	   ! python3 -c 'import venv, ensurepip' 2>/dev/null || \
	   ! /sbin/ldconfig -p | grep -q libgomp.so.1; then \
		echo "installing $(DEBIAN_PACKAGES)"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(DEBIAN_PACKAGES); \
	fi

# NVIDIA's PTX assembler, which the GPU back end's tests run on every kernel
# (no CUDA toolkit or GPU needed): the nvidia-cuda-nvcc-cu12 wheel in a
# virtual environment under target/.
CUDA_VENV := target/cuda-venv
CUDA_PACKAGES := nvidia-cuda-nvcc-cu12==12.9.86
setup-cuda: setup
	@ls $(CUDA_VENV)/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas >/dev/null 2>&1 || \
		{ python3 -m venv $(CUDA_VENV) && $(CUDA_VENV)/bin/pip install -q $(CUDA_PACKAGES); }

# The cargo tools the tests use.
setup-test-tools:
	@$(CARGO) nextest --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-nextest
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz

# Check an example model, print its optimized graph IR, compile it for this
# CPU and run it, checked against the reference interpreter. Builds dlc-opt
# too, which the README's examples use.
run: setup
	$(CARGO) build --release --locked -p dlc -p dlc-opt
	./target/release/dlc check $(EXAMPLE)
	./target/release/dlc compile $(EXAMPLE) --emit graph -o -
	./target/release/dlc run $(EXAMPLE) --backend cpu --random-inputs 0 --check

# The second clippy is dlc without MPI (its one feature), for the whole
# workspace, so that every other crate keeps the features of the first and
# is not checked again (`-p dlc` alone resolves other features: about 100
# crates again, a minute or two).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy --workspace --all-targets --locked --no-default-features -- -D warnings

# The fuzz run goes first so that the test runner's summary closes the output.
# On a machine with AVX-512 the tests whose results depend on the CPU (compiled
# code, the schedules and cost model that read its vector width, MLIR's
# execution engine, and the Python package's tests, which compile the
# convolutions and gradients PyTorch hands the backend) run a second time as
# an AVX2 machine would run them (DLC_CPU=x86-64-v3), so that what passes
# here passes on AVX2-only machines (a stride-2 convolution once failed only
# on AVX2, in the Python tests alone).
# `DLC_CPU=x86-64-v3 make test` runs everything that way, once.
CPU_DEPENDENT_TESTS := binary_id(dlc-llvm::jit) | binary_id(dlc::cli) | binary_id(dlc-lower::differential) \
	| binary_id(dlc-mlir::mlir) | package(dlc-tests)
test: setup setup-test-tools setup-cuda lint
	$(MAKE) fuzz-smoke
	$(MAKE) python-test
	$(CARGO) nextest run --workspace --locked --no-fail-fast
	@if [ -z "$$DLC_CPU" ] && grep -qw avx512f /proc/cpuinfo; then \
		echo "The tests that depend on the CPU, again as an AVX2 machine (DLC_CPU=x86-64-v3):"; \
		DLC_CPU=x86-64-v3 $(CARGO) nextest run --workspace --locked --no-fail-fast \
			-E '$(CPU_DEPENDENT_TESTS)' && \
		DLC_CPU=x86-64-v3 $(PYTHON_VENV)/bin/python -m pytest -q -p no:cacheprovider python/tests; \
	fi

# The Python package (python/, pyo3 + maturin): `pip install ./python`
# builds it, as a user does, into a virtual environment with the pinned
# build and test packages; in the dev profile, so that it shares the test
# build's compiled crates (a user's `pip install ./python` builds the
# release profile). Then its pytest suite. PyTorch (for the torch.compile
# backend's tests) and torchvision (its models, random weights) come from
# PyPI with CUDA's libraries, about 5 GiB: the environment lives outside
# the clone, keyed by the pinned versions, so a machine makes it once.
PYTHON_PACKAGES := maturin==1.16.0 numpy==2.4.6 pytest==9.2.0 torch==2.14.1 torchvision==0.29.2
PYTHON_VENV := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dlc/venvs/python-$(subst ==,-,$(subst $() ,_,$(PYTHON_PACKAGES)))
setup-python: setup
	@$(PYTHON_VENV)/bin/python -c "import maturin, numpy, pytest, torch, torchvision" 2>/dev/null || \
		{ python3 -m venv $(PYTHON_VENV) && $(PYTHON_VENV)/bin/pip install -q $(PYTHON_PACKAGES); }

python-test: setup-python
	PATH="$(PYTHON_VENV)/bin:$$PATH" MATURIN_PEP517_ARGS="--profile dev --locked" \
		$(PYTHON_VENV)/bin/pip install -q --no-build-isolation --no-deps --force-reinstall ./python
	$(PYTHON_VENV)/bin/python -m pytest -q -p no:cacheprovider python/tests

# The Python package's per-call overhead against a direct C ABI call, and
# torch.compile(backend="dlc") against eager PyTorch and Inductor at 1 and 2
# threads, each checked against eager first (scripts/bench_python.py):
# target/bench/python.md and python.json. The package is built as a user's
# `pip install ./python` builds it, in the release profile.
bench-python: setup-python
	PATH="$(PYTHON_VENV)/bin:$$PATH" $(PYTHON_VENV)/bin/pip install -q --no-build-isolation --no-deps --force-reinstall ./python
	$(PYTHON_VENV)/bin/python scripts/bench_python.py target/bench --runs $(or $(RUNS),20) $(if $(ONLY),--only $(ONLY))

# A short, bounded fuzzing run of the front end, the graph pipeline and the tile
# level, seeded with the examples and the pass test files (source, graph, loop
# and tile IR).
FUZZ_SECONDS ?= 60
ONNX_FUZZ_SECONDS ?= 30
fuzz-smoke: setup-test-tools
	mkdir -p fuzz/corpus/frontend
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run frontend --sanitizer none \
		corpus/frontend ../examples ../examples/language ../tests/tests/passes -- \
		-max_total_time=$(FUZZ_SECONDS) -max_len=4096 -rss_limit_mb=4096 -timeout=10
	mkdir -p fuzz/corpus/onnx
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run onnx --sanitizer none \
		corpus/onnx ../tests/onnx -- \
		-max_total_time=$(ONNX_FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=4096 -timeout=10

# dlc bench on W1..W8: target/bench/results.md and results.json.
# RUNS=20 timed runs per entry point (slow while matmuls are naive loops).
bench: setup
	$(CARGO) build --release --locked -p dlc
	RUNS=$(or $(RUNS),20) ./scripts/bench.sh

# The GPU check's folder, made here with no GPU (docs/testing.md): the runner
# dlc-rt, every workload, differential program, narrow-float and tensor-core
# case compiled to GPU modules for sm_90 with the reference interpreter's
# results, and the PyTorch comparison, in target/gpu-check/ (under 56 MiB).
# On a machine with an NVIDIA GPU: bash target/gpu-check/gpu-check.sh DIR.
gpu-check-prepare: setup
	$(CARGO) build --release --locked -p dlc -p dlc-rt
	./scripts/gpu_check_prepare.sh

# The GPU training check's folder, made here with no GPU: dlc built without
# MPI (xz'd), the models it trains, and the script that trains them on the
# CPU and the GPU (NCCL summing the data-parallel gradients) and times W2's
# step against PyTorch's, in target/gpu-train-check/ (under 56 MiB).
# On a machine with an NVIDIA GPU: bash target/gpu-train-check/gpu-train-check.sh DIR.
gpu-train-check-prepare: setup
	./scripts/gpu_train_check_prepare.sh

# The same on GPU 0 (`dlc bench --backend gpu`): needs an NVIDIA GPU and its
# driver; without one the first `dlc bench` says so and this stops.
bench-gpu: setup
	$(CARGO) build --release --locked -p dlc
	BACKEND=gpu RUNS=$(or $(RUNS),20) ./scripts/bench.sh

# W1..W8 on dlc, onnxruntime and JAX (XLA CPU) in one run, at 1 and 2
# threads, each checked against a float64 reference before its time counts,
# with the machine's FMA peak (scripts/fma_peak.c) and each process's peak
# memory: target/bench/peers.md (medians and dlc / best-peer ratios) and
# peers.json. The peers live in a virtual environment under target/.
PEERS_VENV := target/peers-venv
PEERS_PACKAGES := jax[cpu]==0.10.2 onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6
bench-peers: setup
	@$(PEERS_VENV)/bin/python -c "import jax, onnx, onnxruntime, numpy" 2>/dev/null || \
		{ python3 -m venv $(PEERS_VENV) && $(PEERS_VENV)/bin/pip install -q $(PEERS_PACKAGES); }
	$(CARGO) build --release --locked -p dlc
	$(PEERS_VENV)/bin/python scripts/bench_peers.py target/release/dlc target/bench \
		--runs $(or $(RUNS),20) $(if $(ONLY),--only $(ONLY))

# Contractions written in index notation (bench/contract/*.dl) on dlc, PyTorch
# (eager) and JAX in one run, at 1 and 2 threads, each checked against a
# float64 reference before its time counts: target/bench/contract.md (medians,
# spreads, dlc / best-peer ratios and their geometric mean). PyTorch from PyPI
# brings CUDA's libraries (about 5 GiB), so its environment lives outside the
# clone, keyed by the pinned versions, and is made once per machine.
CONTRACT_PACKAGES := torch==2.15.0 jax[cpu]==0.10.2 numpy==2.4.6
CONTRACT_VENV := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dlc/venvs/contract-$(subst ==,-,$(subst $() ,_,$(subst [cpu],,$(CONTRACT_PACKAGES))))
bench-contract: setup
	@$(CONTRACT_VENV)/bin/python -c "import torch, jax, numpy" 2>/dev/null || \
		{ python3 -m venv $(CONTRACT_VENV) && $(CONTRACT_VENV)/bin/pip install -q $(CONTRACT_PACKAGES); }
	$(CARGO) build --release --locked -p dlc
	$(CONTRACT_VENV)/bin/python scripts/bench_contract.py target/release/dlc target/bench \
		--runs $(or $(RUNS),20) $(if $(ONLY),--only $(ONLY))

# One training step (forward, backward, SGD update) of W2, W3 b8 (batch
# statistics), W6 and W7 on dlc, PyTorch (eager and torch.compile) and JAX, at 1
# and 2 threads, with each dlc gradient checked against JAX's:
# target/bench/train.md. PyTorch and JAX from bench-contract's environment.
bench-train: setup
	@$(CONTRACT_VENV)/bin/python -c "import torch, jax, numpy" 2>/dev/null || \
		{ python3 -m venv $(CONTRACT_VENV) && $(CONTRACT_VENV)/bin/pip install -q $(CONTRACT_PACKAGES); }
	$(CARGO) build --release --locked -p dlc
	$(CONTRACT_VENV)/bin/python scripts/bench_train.py target/release/dlc target/bench \
		--runs $(or $(RUNS),20) $(if $(ONLY),--only $(ONLY))

# Data-parallel training steps of W2 and W6 on 1 and 2 ranks here (one core
# each): `dlc train --ranks N` (Open MPI) against PyTorch DDP on gloo, with
# the share of each step spent summing gradients (docs/performance.md).
bench-distributed: setup
	@$(CONTRACT_VENV)/bin/python -c "import torch, numpy" 2>/dev/null || \
		{ python3 -m venv $(CONTRACT_VENV) && $(CONTRACT_VENV)/bin/pip install -q $(CONTRACT_PACKAGES); }
	$(CARGO) build --release --locked -p dlc
	$(CONTRACT_VENV)/bin/python scripts/bench_distributed.py target/release/dlc target/bench \
		$(if $(STEPS),--steps $(STEPS)) $(if $(ONLY),--only $(ONLY))

# The digits classifiers of examples/train trained by dlc and by PyTorch from
# the same initial weights and hyperparameters: test accuracies, final losses
# and steps per second at one thread, target/bench/train-peers.md. PyTorch
# from the environment bench-contract makes.
train-peers: setup
	@$(CONTRACT_VENV)/bin/python -c "import torch, numpy" 2>/dev/null || \
		{ python3 -m venv $(CONTRACT_VENV) && $(CONTRACT_VENV)/bin/pip install -q $(CONTRACT_PACKAGES); }
	$(CARGO) build --release --locked -p dlc
	$(CONTRACT_VENV)/bin/python scripts/train_peers.py target/release/dlc target/bench \
		--epochs $(or $(EPOCHS),20)

# graph.saturate on W2, W6, W8 and Tensat-style graphs: target/bench/saturate.md.
bench-saturate: setup
	$(CARGO) build --release --locked -p dlc -p dlc-opt
	./scripts/saturate.sh

# ONNX's own backend node tests (from the onnx Python package) through
# `dlc run --backend cpu`: target/onnx-tests/results.md (passed, failed,
# unsupported, crashed; per op). onnx-models rebuilds the real-model tests
# under tests/onnx/ with onnxruntime's outputs. Both use a virtual
# environment under target/ with these pinned packages.
ONNX_VENV := target/onnx-venv
ONNX_PACKAGES := onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6
setup-onnx:
	@$(ONNX_VENV)/bin/python -c "import onnx, onnxruntime, numpy" 2>/dev/null || \
		{ python3 -m venv $(ONNX_VENV) && $(ONNX_VENV)/bin/pip install -q $(ONNX_PACKAGES); }

onnx-tests: setup setup-onnx
	$(CARGO) build --release --locked -p dlc
	$(ONNX_VENV)/bin/python scripts/onnx_node_tests.py target/release/dlc target/onnx-tests

# The networks people export (torchvision's and torch.nn's, random weights,
# exported here) and the real-model tests, timed by dlc and onnxruntime in
# one run: cold `dlc run`, error, latency at 1 and 2 threads ->
# target/onnx-bench/results.md.
onnx-bench: setup setup-onnx-torch
	$(CARGO) build --release --locked -p dlc
	$(ONNX_TORCH_VENV)/bin/python scripts/onnx_bench.py target/release/dlc

# One of those models' products (with their epilogues) each on its own,
# dlc against onnxruntime: MODEL=mobilenet_v2 (any onnx-bench model),
# EVICT=40 to write 40 MB of other memory before every call ->
# target/onnx-bench/MODEL/layers.md.
MODEL ?= mobilenet_v2
EVICT ?= 0
onnx-layers: setup setup-onnx-torch
	$(CARGO) build --release --locked -p dlc
	$(ONNX_TORCH_VENV)/bin/python scripts/onnx_layers.py target/release/dlc --model $(MODEL) --evict $(EVICT)

onnx-profile: setup setup-onnx-torch
	$(CARGO) build --release --locked -p dlc
	$(ONNX_TORCH_VENV)/bin/python scripts/onnx_profile.py target/release/dlc --model $(MODEL) --rounds $(or $(ROUNDS),4) --threads $(or $(THREADS),1)

onnx-models: setup-onnx
	$(ONNX_VENV)/bin/python scripts/onnx_models.py

# The real-model tests PyTorch's exporters write (tests/onnx/torch_*), in an
# environment with PyTorch (about 5 GiB, outside the clone like
# setup-python's, keyed by the pinned versions).
ONNX_TORCH_PACKAGES := torch==2.14.1 torchvision==0.29.2 onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2 numpy==2.4.6
ONNX_TORCH_VENV := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dlc/venvs/onnx-torch-$(subst ==,-,$(subst $() ,_,$(ONNX_TORCH_PACKAGES)))
setup-onnx-torch:
	@$(ONNX_TORCH_VENV)/bin/python -c "import torch, torchvision, onnx, onnxruntime, onnxscript" 2>/dev/null || \
		{ python3 -m venv $(ONNX_TORCH_VENV) && $(ONNX_TORCH_VENV)/bin/pip install -q $(ONNX_TORCH_PACKAGES); }

onnx-torch-models: setup-onnx-torch
	$(ONNX_TORCH_VENV)/bin/python scripts/onnx_torch_models.py

clean:
	$(CARGO) clean

# cyzero: set up, build, run, test.
#
#   make engine   set up .venv with what the engine needs (numpy, python-chess, pyzmq, msgpack,
#                 the CPU runtimes ONNX Runtime and OpenVINO, or onnxruntime-gpu with GPU=1;
#                 no torch), build the Cython core, start the UCI engine
#   make test     the engine's set-up, plus torch (TORCH) and the train and dev extras, then the
#                 whole test suite, in parallel, with the reasons of skipped tests listed (-rs)
#                 (TESTS=tests/test_x.py picks files, ARGS='-k name' adds pytest options)
#   make bench    the engine's set-up, then `cyzero bench perft`
#   make gpu-check  the set-up of `make test`, then, on a machine with a CUDA GPU, the `gpu` tests and the GPU
#                 benchmarks (nn, search, selfplay, train) with one summary table at the end; each
#                 bench's JSON goes to GPUCHECK_OUT (default a new temp folder). Without a usable
#                 GPU it stops at once and says why (docs/gpu.md)
#   make train    the set-up of `make test`, then a training run on this machine: `cyzero-train run $(RUN)`,
#                 started with the bundled CPU config (--config cpu) and resumed with the run's
#                 own RUN/config.toml, so edits to it are kept (RUN=runs/x picks the run
#                 directory, default runs/cpu; CONFIG=gpu, a bundled config's name or a TOML file,
#                 runs with that config instead, from the start or on resuming; PORT=5790 puts the
#                 daemon on ports 5790-5792 and PORT=auto on free ones, for a second run beside
#                 another; ARGS='--devices cuda:0' adds options)
#
# `make engine` is a UCI engine command: stdout carries nothing but UCI, so every
# recipe is silent (@) and pip's and the compiler's output goes to stderr (>&2).
# From another folder use `make -s -C /path/to/cyzero engine`: -s keeps make's
# "Entering directory" lines off stdout.
#
# One venv for all: `make engine` installs the project with its own dependencies
# only; `make test`, `make train` and `make gpu-check` add torch and the train
# and dev extras to the same venv when they first need them.
#
# GPU=1 installs onnxruntime-gpu (the `gpu` extra) in place of ONNX Runtime's CPU build, GPU=0
# the CPU runtimes only; the default is 1 where `nvidia-smi` answers. A venv switched either
# way keeps one onnxruntime: the two builds are one import package.
#
# TORCH is installed on its own, before the extras, so that no dependency
# pulls an unpinned (multi-GB CUDA) torch. It is a pip requirement followed by
# pip options if you like. TORCH_INDEX is the index pip takes torch (and only torch) from; unset,
# it is PyTorch's CPU index on Linux without an NVIDIA GPU (a CUDA build is several GB) and pip's
# own index elsewhere. An index that does not answer within 5 s costs one line: pip then takes torch
# from its own index. Another index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cu130

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
SYSTEM ?= $(shell uname -s)
TORCH_INDEX ?= $(if $(filter Linux,$(SYSTEM)),$(if $(GPU_EXTRA),,$(TORCH_CPU_INDEX)))
GPU ?=
TESTS ?= tests
RUN ?= runs/cpu
CONFIG ?=
PORT ?=
ARGS ?=

VPY := $(VENV)/bin/python
comma := ,
PIP := $(VPY) -m pip
# The engine's dependencies and the project (editable) are installed.
ENGINE_STAMP := $(VENV)/.cyzero-engine
# ... and torch (TORCH) with the train and dev extras.
STAMP := $(VENV)/.cyzero-installed
TORCH_SPEC := $(VENV)/.cyzero-torch
# Which onnxruntime the venv holds (GPU): a change reinstalls the engine's runtime.
RUNTIME_SPEC := $(VENV)/.cyzero-runtime
GPU_EXTRA := $(if $(filter 1,$(or $(GPU),$(shell nvidia-smi -L >/dev/null 2>&1 && echo 1))),gpu)
# The Cython core was built from these sources: the engine starts without running setup.py again.
BUILT := $(VENV)/.cyzero-built
CORE_SOURCES := $(wildcard cython_src/*.pyx) $(wildcard engine/*.pxd) setup.py

.PHONY: all venv install build engine train test bench gpu-check clean distclean FORCE

all: build

venv install: $(STAMP)

# Rewritten only when the TORCH spec (or GPU) changes, so that a new spec reinstalls.
# printf, not echo: the spec goes into the file as one word-for-word line.
$(TORCH_SPEC): FORCE
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV) >&2
	@printf '%s\n' "$$CYZERO_TORCH $$CYZERO_TORCH_INDEX" | cmp -s - $@ || printf '%s\n' "$$CYZERO_TORCH $$CYZERO_TORCH_INDEX" > $@

$(RUNTIME_SPEC): FORCE
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV) >&2
	@printf 'GPU=%s\n' "$(GPU_EXTRA)" | cmp -s - $@ || printf 'GPU=%s\n' "$(GPU_EXTRA)" > $@

# The TORCH spec reaches the shell through the environment, never pasted into a
# recipe: quotes in it cannot break out. It is split into words on purpose
# (requirement, then pip options); each word is still passed to pip as one argument.
# TORCH_INDEX becomes pip's --index-url for the torch install alone (PyTorch's CPU index holds
# torch's own dependencies too), once INDEX_ANSWERS found it answering; empty, or silent, pip uses
# its usual index, which is all some machines reach.
export CYZERO_TORCH := $(TORCH)
export CYZERO_TORCH_INDEX := $(TORCH_INDEX)
# Exit 0 when the index (argv[1]) answers within 5 s: a folder for a file: URL, any answer otherwise.
INDEX_ANSWERS := import os, sys, urllib.parse as p, urllib.request as r; u = sys.argv[1]; s = p.urlsplit(u); \
	sys.exit(0 if (os.path.isdir(r.url2pathname(s.path)) if s.scheme == "file" else r.urlopen(u, timeout=5)) else 1)

# onnxruntime and onnxruntime-gpu are one import package: keep only the one GPU asks for. The
# other is removed, and the one kept reinstalled over the files they shared. (The project needs
# onnxruntime, so with GPU=1 pip installs both and the CPU build goes here.)
define ONE_ONNXRUNTIME
	@keep=$(if $(GPU_EXTRA),onnxruntime-gpu,onnxruntime); \
	drop=$(if $(GPU_EXTRA),onnxruntime,onnxruntime-gpu); \
	if $(PIP) show -q $$drop >/dev/null 2>&1; then \
		echo "removing $$drop: GPU=$(if $(GPU_EXTRA),1,0) keeps $$keep (make engine GPU=$(if $(GPU_EXTRA),0,1) switches)" >&2; \
		$(PIP) uninstall -y $$drop >&2; \
		$(PIP) install --force-reinstall --no-deps $$keep >&2; \
	fi
endef

# The engine: Cython and numpy first (the build needs them in the venv itself: `make build`
# compiles in place), then the core, compiled once, in place, with -j 2, then the project with its
# own dependencies: pip's editable build finds the compiled modules current and copies them
# (setup.py's BuildExt), as do the later installs of `make test` and `make train`.
$(ENGINE_STAMP): setup.py pyproject.toml $(RUNTIME_SPEC)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV) >&2
	@$(PIP) install -q --upgrade pip >&2
	@$(PIP) install 'cython>=3.0' numpy setuptools wheel >&2
	@$(VPY) setup.py -q build_ext --inplace -j 2 >&2
	@$(PIP) install --no-build-isolation -e '.$(if $(GPU_EXTRA),[gpu])' >&2
	$(ONE_ONNXRUNTIME)
	@touch $@ && touch $(BUILT)

# The rest, for tests and training: the pinned torch first, then the extras.
$(STAMP): $(ENGINE_STAMP) $(TORCH_SPEC)
	@set -f; index=$$CYZERO_TORCH_INDEX; \
	if [ -n "$$index" ] && ! $(VPY) -c '$(INDEX_ANSWERS)' "$$index" 2>/dev/null; then \
		echo "torch: $$index did not answer within 5 s; pip takes torch from its own index (on Linux a CUDA build of several GB; TORCH_INDEX=URL picks another)" >&2; \
		index=; \
	fi; \
	$(PIP) install $$CYZERO_TORCH $${index:+--index-url "$$index"} >&2
	@$(PIP) install --no-build-isolation -e '.[train,dev$(if $(GPU_EXTRA),$(comma)gpu)]' >&2
	$(ONE_ONNXRUNTIME)
	@touch $@

# Only when a .pyx, a .pxd or setup.py changed since the last build (or the venv is new).
$(BUILT): $(ENGINE_STAMP) $(CORE_SOURCES)
	@$(VPY) setup.py -q build_ext --inplace -j 2 >&2
	@touch $@

# Always runs: Cython and the compiler only redo what changed.
build: $(ENGINE_STAMP)
	@$(VPY) setup.py -q build_ext --inplace -j 2 >&2
	@touch $(BUILT)

engine: $(BUILT)
	@exec $(VENV)/bin/cyzero $(ARGS)

# The run is make's child: Ctrl-C in its terminal reaches both and stops it cleanly. From elsewhere
# (`make train &`): `kill -TERM <make's pid>` (make passes SIGTERM on to the run, but not SIGINT:
# `kill -INT <make's pid>` leaves the run training), or `kill -INT <pid>` with the daemon's pid from
# `cyzero-train status $(RUN)` (RUN/daemon.json).
train: $(STAMP) $(BUILT)
	@exec $(VENV)/bin/cyzero-train run $(RUN) $(if $(CONFIG),--config $(CONFIG),$(if $(wildcard $(RUN)/config.toml),,--config cpu)) $(if $(PORT),--port $(PORT)) $(ARGS)

# pytest-xdist: one worker per core; -rs lists every skipped test with its reason. ARGS adds
# pytest options, TESTS picks files. Bytecode caches are written even where the environment says
# PYTHONDONTWRITEBYTECODE (some CI images do): the suite starts hundreds of Python processes
# (engines, learners, workers), each of which would compile the project again, and pytest would
# rewrite every test module's asserts again in each worker (about a tenth of the suite's time).
test: $(STAMP) $(BUILT)
	PYTHONDONTWRITEBYTECODE= $(VPY) -m pytest -q -n auto -rs $(TESTS) $(ARGS)

bench: $(BUILT)
	@$(VENV)/bin/cyzero bench perft $(ARGS)

# The gpu tests (ARGS adds pytest options), then each GPU bench with its JSON in $GPUCHECK_OUT/NAME.json
# and its stderr in NAME.log; a step that fails is reported and the next one still runs. The summary
# (trainer/gpucheck.py) reads the folder; the exit status is 1 when a test or a bench failed.
# GPU_NN_BATCHES: the batch sizes `bench nn` times (the padded sizes a GPU session runs).
GPUCHECK_OUT ?=
# SYSTEM_PYTHON=1: no venv and no pip: $(PYTHON) and the cyzero commands on PATH as they are, for
# a GPU machine set up by hand without internet (docs/gpu.md, "Installing on a machine without
# internet"), where the venv's installs would fail.
ifdef SYSTEM_PYTHON
GPU_CHECK_SETUP :=
GPU_CHECK_BIN :=
gpu-check: VPY := $(PYTHON)
else
GPU_CHECK_SETUP := $(STAMP) $(BUILT)
GPU_CHECK_BIN := $(VENV)/bin/
endif
GPU_NN_BATCHES ?= 1,2,4,8,16,32,64,128,256,512,1024,2048
export GPUCHECK_OUT

gpu-check: $(GPU_CHECK_SETUP)
	@$(VPY) -m trainer.gpucheck --preflight || exit 2; \
	out="$${GPUCHECK_OUT:-$$(mktemp -d "$${TMPDIR:-/tmp}/cyzero-gpucheck.XXXXXX")}"; \
	mkdir -p "$$out" || exit 2; \
	echo "gpu-check: results go to $$out" >&2; \
	status=0; \
	echo "gpu-check: pytest -m gpu" >&2; \
	$(VPY) -m pytest -q -m gpu -rs --junitxml="$$out/gpu-tests.xml" $(TESTS) $(ARGS) >&2 || status=1; \
	bench() { name=$$1; shift; echo "gpu-check: $$name: $$*" >&2; \
		if "$$@" > "$$out/$$name.json" 2> "$$out/$$name.log"; then :; else \
			echo "gpu-check: $$name failed (exit $$?): see $$out/$$name.log" >&2; status=1; fi; }; \
	bench nn $(GPU_CHECK_BIN)cyzero bench nn --backend cuda --json --batches $(GPU_NN_BATCHES) \
		--net engine/nets/default.onnx --net engine/nets/default.fp16.onnx; \
	bench search $(GPU_CHECK_BIN)cyzero bench search --backend cuda --json; \
	big=$$($(VPY) -c "from trainer.bench import fresh_network; from trainer.config import load_named_config; \
		print(fresh_network(load_named_config('gpu')))") && \
		bench search-20x256 $(GPU_CHECK_BIN)cyzero bench search --backend cuda --json --net "$$big"; \
	bench selfplay $(GPU_CHECK_BIN)cyzero-train bench selfplay --device cuda:0 --json; \
	bench selfplay-gpu $(GPU_CHECK_BIN)cyzero-train bench selfplay --device cuda:0 --config gpu --json; \
	bench train $(GPU_CHECK_BIN)cyzero-train bench train --json; \
	bench train-bt $(GPU_CHECK_BIN)cyzero-train bench train --config gpu-bt --json; \
	$(VPY) -m trainer.gpucheck "$$out" || status=1; \
	exit $$status

clean:
	rm -rf build dist *.egg-info .pytest_cache
	rm -f cython_src/*.c cython_src/*.html engine/*.so $(BUILT)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

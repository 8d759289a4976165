# cyzero: set up, build, run, test.
#
#   make engine   set up .venv, build the Cython core, start the UCI engine
#   make test     same set-up, then the whole test suite
#   make bench    same set-up, then `cyzero bench perft`
#
# TORCH is installed on its own, before the project, so that no dependency
# pulls an unpinned (multi-GB CUDA) torch: `make TORCH='torch==2.14.1' test`.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=

VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
STAMP := $(VENV)/.cyzero-installed
TORCH_SPEC := $(VENV)/.cyzero-torch

.PHONY: all venv install build engine train test bench clean distclean FORCE

all: build

venv install: $(STAMP)

# Rewritten only when the TORCH spec changes, so that a new spec reinstalls.
$(TORCH_SPEC): FORCE
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@echo '$(TORCH)' | cmp -s - $@ || echo '$(TORCH)' > $@

$(STAMP): setup.py pyproject.toml $(TORCH_SPEC)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install '$(TORCH)'
	@# onnxruntime and onnxruntime-gpu are one import package: never keep both.
	@if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ] && $(PIP) show -q onnxruntime >/dev/null 2>&1; then \
		echo "removing plain onnxruntime: onnxruntime-gpu replaces it on Linux x86_64"; \
		$(PIP) uninstall -y onnxruntime; \
		if $(PIP) show -q onnxruntime-gpu >/dev/null 2>&1; then \
			$(PIP) install --force-reinstall --no-deps onnxruntime-gpu; \
		fi; \
	fi
	@# The build needs Cython and numpy in the venv itself: `make build` compiles in place.
	$(PIP) install 'cython>=3.0' numpy setuptools wheel
	$(PIP) install --no-build-isolation -e '.[train,dev]'
	touch $@

# Always run: Cython and the compiler only redo what changed.
build: $(STAMP)
	$(VPY) setup.py build_ext --inplace -j 2

engine: build
	exec $(VENV)/bin/cyzero $(ARGS)

train: build
	exec $(VENV)/bin/cyzero-train $(ARGS)

test: build
	$(VPY) -m pytest -q tests $(ARGS)

bench: build
	$(VENV)/bin/cyzero bench perft $(ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
	rm -f cython_src/*.c cython_src/*.html engine/*.so
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

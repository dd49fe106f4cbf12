# Quick start: `make sweep` (the main 4-point sweep) and `make test` (the test suite, what CI
# runs); `make test-fast` is the unit-level part (tests not marked slow), `make lint` the style
# and import-layer checks (ARCHITECTURE.md), `make test-compat` the torch-sensitive tests on the
# oldest torch the project supports.
# Every install is pinned by requirements/lock.txt (`pip install -c`): a fresh machine gets the
# set the suite passed on. `make lock` resolves it again (docs/install.md: bump, test, commit).
# `make sweep` installs the package and torch only; `make test` adds the dev and optional
# extras (pytest, ruff, notebooks, transformers, torchao, submitit, ...).
# On a CUDA machine pip takes the lock's torch release from PyPI (a CUDA build); CI's CPU
# machines carry its CPU build on disk. TORCH names another (e.g. TORCH=torch==2.12.1, outside
# the lock: give LOCK= an empty value too).
# PYTHON is the interpreter .venv is made from (.ci/run picks the system's python3: on the CI
# image it runs the suite in about 3/4 of the time pyenv's takes; docs/install.md). A .venv made
# by another one stays until `make clean`.
PYTHON ?= python3
TORCH ?= torch
LOCK ?= requirements/lock.txt
CONSTRAIN := $(if $(LOCK),-c $(LOCK))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# the second environment of make test-compat: the oldest supported torch, its own lock
COMPAT_VENV := .venv-compat
COMPAT_LOCK := requirements/lock-compat.txt
COMPAT_STAMP := $(COMPAT_VENV)/.installed
# the third, of make test-floors: pyproject's lower bounds (requirements/floors.txt)
FLOORS_VENV := .venv-floors
FLOORS := requirements/floors.txt
FLOORS_STAMP := $(FLOORS_VENV)/.installed
# the platform the locks are resolved for: CI's (CPython 3.11, x86-64 Linux)
LOCK_FOR := --python-version 3.11 --python-platform x86_64-manylinux_2_28

.PHONY: setup setup-dev sweep test test-heavy test-fast test-compat test-floors test-gpu test-slurm lint bench lock lock-floors clean

setup: $(STAMP)
setup-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml $(LOCK)
	# an existing .venv keeps its interpreter: `python -m venv` over it from another Python
	# rewrites pyvenv.cfg's home, and the old links then load the other one's stdlib
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(CONSTRAIN) pip
	$(BIN)/pip install --quiet $(CONSTRAIN) "$(TORCH)" -e .
	touch $(STAMP)

# The extras of the package make setup installed (its name, not -e: pip keeps that install and
# adds what the extras ask, instead of building the editable wheel again), with --no-compile:
# pip byte-compiles every module it installs, transformers' thousands included, and Python
# compiles the few a test imports as it first imports them (make setup-dev: 4 s, not 17)
$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-compile $(CONSTRAIN) "nanogpt-sweep[dev,transformers]"
	touch $(DEV_STAMP)

sweep: $(STAMP)
	$(BIN)/python -m nanogpt.run -m perf.compile=true,false perf.dtype=bf16,fp16

# The suite runs on JOBS worker processes (pytest-xdist), a test file to a worker (its module's
# sweeps run once), and names its slowest tests; the tests marked `alone` (they measure a
# difference that needs every core idle) run after, by themselves, from their one file (so that
# run does not collect the whole suite again).
# `make test-fast` runs what starts no process (tests/process_guard.py fails one that does).
# Three workers on CI's 2 cores: the tests wait on the processes they start (sweeps, torchrun,
# W&B), so two workers kept the cores 135-145 % busy of 200 %; each worker's torch computes on one
# thread (tests/conftest.py). Modules go out with the most process-starting tests first
# (conftest's pytest_collection_modifyitems), not by xdist's count of tests.
JOBS ?= 3

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "not alone and not slurm and not heavy" --durations=20
	$(BIN)/python -m pytest -q -m "alone and not slurm" tests/test_alone.py --durations=5

# The tests marked `heavy` (tests/test_compile_economics.py: each way of compiling a model, from
# cold, warm and artifact caches, Inductor's g++ each time; and the compiled chunked-loss point,
# 25-29 kernels from a cold cache): minutes of compiling on 2 cores, so they are not in make
# test; .ci/run runs them after it (a file to a worker, its module's sweeps once).
test-heavy: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadscope -m "heavy and not slurm" --durations=10

test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadscope -m "not slow" --durations=10

# A real one-node SLURM cluster (scripts/slurm_cluster.sh installs and starts it; root): the
# tests of hydra/launcher=slurm, minutes each.
# The SLURM tests mostly wait on SLURM's own timers (a requeued job's hold, a time limit): two
# workers, each with its own clusters (tests/slurm/conftest.py), a test to a worker as it frees.
test-slurm: $(DEV_STAMP)
	scripts/slurm_cluster.sh install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m slurm tests/slurm --durations=12

test-gpu: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -m cuda

lint: $(DEV_STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

bench: $(DEV_STAMP)
	$(BIN)/python benchmarks/runner_overhead.py
	$(BIN)/python benchmarks/point_isolation.py

# The tests whose answer depends on torch's version (marker `compat`: compile health and graph
# breaks, the chunked loss compiled, FlopCounterMode's counts, the profiler's split, DDP and FSDP2
# on gloo, the transformers and user-model points), in a second venv with the oldest supported
# torch (PyPI's build of it, CUDA libraries included, runs on the CPU) and the rest of
# requirements/lock-compat.txt. The first line of its output names the torch it ran.
test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c 'import torch, transformers; print("test-compat: torch", torch.__version__, "transformers", transformers.__version__)'
	$(COMPAT_VENV)/bin/python -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "compat and not alone and not slurm" --durations=10

$(COMPAT_STAMP): pyproject.toml $(COMPAT_LOCK)
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet -c $(COMPAT_LOCK) pip
	$(COMPAT_VENV)/bin/pip install --quiet -c $(COMPAT_LOCK) torch -e ".[dev,transformers]"
	touch $(COMPAT_STAMP)

# The floors: pyproject.toml's lower bounds, each direct dependency at the oldest release its
# range allows, on the oldest torch (requirements/floors.txt; `make lock-floors` resolves it
# again), in a third venv with pytest alone beside them. It runs the `compat` tests and a slice
# that reaches every floor: Hydra's sweeps and the record (test_config, test_runs), the table
# and its parquet and plots (pandas, pyarrow, matplotlib: test_table, test_analysis, test_compare),
# W&B offline, the tune sweeper (optuna), time to loss (scipy). The first line names its versions.
FLOORS_SLICE := tests/test_config.py tests/test_runs.py tests/test_table.py tests/test_compare.py \
	tests/test_wandb.py tests/test_tune.py tests/test_time_to_loss.py

test-floors: $(FLOORS_STAMP)
	$(FLOORS_VENV)/bin/python -c 'from importlib.metadata import version as v; print("test-floors:", *(f"{p} {v(p)}" for p in ("torch", "pandas", "numpy", "hydra-core", "matplotlib", "pyarrow", "wandb", "optuna", "scipy", "transformers")))'
	$(FLOORS_VENV)/bin/python -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "compat and not alone and not slurm" --durations=10
	$(FLOORS_VENV)/bin/python -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder $(FLOORS_SLICE) --durations=10
	$(FLOORS_VENV)/bin/python -m pytest -q -m "not slow" tests/test_analysis.py

$(FLOORS_STAMP): pyproject.toml $(FLOORS)
	test -x $(FLOORS_VENV)/bin/python || $(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/pip install --quiet -c $(FLOORS) torch -e ".[transformers]" pytest pytest-xdist
	touch $(FLOORS_STAMP)

lock-floors: $(DEV_STAMP)
	$(BIN)/uv pip compile --quiet --upgrade --resolution lowest-direct pyproject.toml --extra transformers requirements/floors.in $(LOCK_FOR) -o $(FLOORS)

# Resolve both locks again from pyproject.toml's ranges (every extra) and requirements/*.in,
# taking the newest each allows (uv, pinned in the lock itself). Then `make test test-compat`
# on the new lock, and commit it with what it changed (docs/install.md).
lock: $(DEV_STAMP)
	$(BIN)/uv pip compile --quiet --upgrade pyproject.toml --all-extras requirements/lock.in $(LOCK_FOR) -o $(LOCK)
	$(BIN)/uv pip compile --quiet --upgrade pyproject.toml --all-extras requirements/compat.in $(LOCK_FOR) -o $(COMPAT_LOCK)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(FLOORS_VENV) multirun outputs build dist *.egg-info

# Quick start: `make sweep` (the main 4-point sweep) and `make test` (the test suite, what CI
# runs); `make test-fast` is the unit-level part (tests not marked slow), `make lint` the style
# and import-layer checks (ARCHITECTURE.md).
# Both create .venv with what they need first. On a CUDA machine, set TORCH to the build you
# want (e.g. TORCH=torch); the default pins the CPU wheel this project's CI machines carry.
# PYTHON is the interpreter .venv is made from (.ci/run picks the system's python3: on the CI
# image it runs the suite in about 3/4 of the time pyenv's takes; docs/install.md). A .venv made
# by another one stays until `make clean`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup sweep test test-fast test-gpu test-slurm lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	# an existing .venv keeps its interpreter: `python -m venv` over it from another Python
	# rewrites pyvenv.cfg's home, and the old links then load the other one's stdlib
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,transformers]"
	touch $(STAMP)

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

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "not alone and not slurm" --durations=20
	$(BIN)/python -m pytest -q -m "alone and not slurm" tests/test_alone.py --durations=5

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadscope -m "not slow" --durations=10

# A real one-node SLURM cluster (scripts/slurm_cluster.sh installs and starts it; root): the
# tests of hydra/launcher=slurm, minutes each.
# The SLURM tests mostly wait on SLURM's own timers (a requeued job's hold, a time limit): two
# workers, each with its own clusters (tests/slurm/conftest.py), a test to a worker as it frees.
test-slurm: $(STAMP)
	scripts/slurm_cluster.sh install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m slurm tests/slurm --durations=12

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m cuda

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/runner_overhead.py
	$(BIN)/python benchmarks/point_isolation.py

clean:
	rm -rf $(VENV) multirun outputs build dist *.egg-info

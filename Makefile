# Fresh machine: `make serve` or `make test`. Both create .venv and install once (stamp file).

PYTHON ?= python3
VENV ?= .venv
PORT ?= 3000
TORCH_VERSION ?= 2.13.0
# Where torch comes from on machines without CUDA. Empty: pip's configured index. Where that is
# PyPI, set it to a CPU index, e.g. `make test TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu`,
# so that pip does not pull the gigabytes of CUDA packages a plain PyPI torch brings.
TORCH_CPU_INDEX ?=

VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.switchyard-installed

.PHONY: install serve test lint proto clean

install: $(STAMP)

# Re-runs only when the dependency list changes. torch goes in first so that the project's
# unpinned `torch` requirement is already satisfied and pulls nothing more.
$(STAMP): pyproject.toml tests/deploy/checkov_env.py
	test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(VENV_PY) -m pip install "torch==$(TORCH_VERSION)" \
			$(if $(TORCH_CPU_INDEX),--extra-index-url $(TORCH_CPU_INDEX)); \
	fi
	$(VENV_PY) -m pip install -e ".[dev]"
	# TGI's own client, for the compatibility tests: without its dependencies, because it pins
	# huggingface-hub<1.0, which transformers 5 cannot import with (it only needs aiohttp and
	# pydantic, which are installed).
	$(VENV_PY) -m pip install --no-deps "text-generation>=0.7"
	# checkov, for deploy/'s checks, in an environment of its own (.venv/checkov): its pins
	# conflict with the project's (tests/deploy/checkov_env.py says which).
	$(VENV_PY) -m tests.deploy.checkov_env
	# The shard's native CPU kernels, built for this machine's CPU and cached (a minute or two of
	# one core), so that neither a first `make serve` nor the tests spend it; a machine that
	# cannot build them serves on the torch paths, as the shard's log then says.
	$(VENV_PY) -m shard.platforms.cpu.native
	touch $@

serve: $(STAMP)
	$(VENV)/bin/launcher --port $(PORT)

# Two pytest-xdist workers, one per core of a CI machine; each takes whole files (pyproject's
# --dist loadfile), so a module's server starts once. With a GPU, one process (0): tests size KV
# caches from the device's free memory and time kernels, which assumes they have it to themselves.
# Override either way, e.g. `make test TEST_WORKERS=4`. Tests marked `serial` (time goals of the
# launcher, which hold on a machine it has to itself) run after, in one process, alone.
TEST_WORKERS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),0,2)

# --durations: the slowest tests at the end of CI's log, where the suite's time goes.
test: $(STAMP)
	$(VENV_PY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" --durations=25
	$(VENV_PY) -m pytest -q -m serial

lint: $(STAMP)
	$(VENV)/bin/ruff check .

proto: $(STAMP)
	$(VENV_PY) -m switchyard_pb.codegen

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# Benchmarks (docs/benchmarks.md): Switchyard vs `transformers serve --continuous-batching` on the
# same CPU, then the shard alone over gRPC. Results, plot and logs go to bench/results/.
# Pass flags through, e.g. `make bench BENCH_ARGS="--concurrency 1 8" SHARD_BENCH_ARGS="--batch-sizes 16"`.
BENCH_STAMP := $(VENV)/.switchyard-bench-installed
BENCH_ARGS ?=
SHARD_BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP)
	$(VENV_PY) -m pip install -e ".[dev,bench]"
	touch $@

.PHONY: bench
bench: $(BENCH_STAMP)
	$(VENV_PY) -m bench.serve $(BENCH_ARGS)
	$(VENV_PY) -m bench.shard $(SHARD_BENCH_ARGS)

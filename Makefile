# Fresh machine: `make serve` or `make test`. Both create .venv and install once (stamp file).

PYTHON ?= python3
VENV ?= .venv
PORT ?= 3000
TORCH_VERSION ?= 2.13.0
# CPU wheels; a plain `torch` from PyPI would pull gigabytes of CUDA packages on a CPU machine.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.switchyard-installed

.PHONY: install serve test lint proto clean

install: $(STAMP)

# Re-runs only when the dependency list changes. Few retries for the torch index: where it is
# unreachable, pip falls back to local wheels (find-links) per package, and pip's default of five
# retries for each of torch's dependencies would add minutes.
$(STAMP): pyproject.toml
	test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(VENV_PY) -m pip install --retries 1 "torch==$(TORCH_VERSION)" \
			--index-url $(TORCH_CPU_INDEX); \
	fi
	$(VENV_PY) -m pip install -e ".[dev]"
	touch $@

serve: $(STAMP)
	$(VENV)/bin/launcher --port $(PORT)

test: $(STAMP)
	$(VENV_PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

proto: $(STAMP)
	$(VENV_PY) -m switchyard_pb.codegen

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

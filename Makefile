# The verbs README names. Everything runs inside $(VENV), created on first use from constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP_INSTALL := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
# Real MultiNLI dev_matched beside our checkouts (../shared/data/README.md); a user's clone has none, and the
# package finds MultiNLI on the hub instead (nli_helpers/mnli.py). Tests that need the file skip without it.
REAL_DATA := $(abspath ../shared/data/mnli_dev_matched.jsonl)
REAL_DATA_ENV := $(if $(wildcard $(REAL_DATA)),NLI_REAL_DATA=$${NLI_REAL_DATA:-$(REAL_DATA)},)
# PyTorch's CPU-only wheels (https://pytorch.org/get-started/locally/: "--index-url
# https://download.pytorch.org/whl/cpu"; it lists torch-2.13.0+cpu for cp311 on x86_64 and aarch64). PyPI's
# default Linux torch is the CUDA 13.0 build with several GB of nvidia-* wheels (PyTorch 2.13 release notes).
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
# papermill's parameter files for make demo, later ones overriding: notebooks/params/smoke.yaml, full.yaml on a GPU
# machine, or "notebooks/params/full.yaml notebooks/params/rehearsal.yaml": the full path on the CPU in minutes.
PARAMS ?= notebooks/params/smoke.yaml

.PHONY: help venv browser demo demo-notebooks train-smoke bench gpu-check image-check test fuzz test-fast lint constraints clean

help:
	@echo "make demo   set up (first time) and run every notebook headlessly on the smoke profile"
	@echo "make test   set up (first time) and run the whole test suite"
	@echo "make fuzz   the trainer command's contract, long: EXAMPLES=3000 drawn cases (about an hour)"
	@echo "make browser  install Debian's chromium (as root) for the JupyterLab UI test, which skips without it"
	@echo "make bench  the throughput benchmark (--quick) into runs/throughput.json"
	@echo "make gpu-check  roberta-base-shaped bf16/fp16/Trainer runs on this machine's GPU into runs/gpu_check.json"
	@echo "make image-check  resolve every install step of docker/Dockerfile against PyPI and Debian's index"
	@echo "make lint | constraints | clean"

$(STAMP): pyproject.toml localcloud/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "error: $(PYTHON) is $$($(PYTHON) --version 2>&1 || echo missing); this project needs Python 3.11 or" \
	       "newer (numpy 2.4, pandas 3.1 and transformers 5.23 do). Install one and run make PYTHON=python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build. Without an NVIDIA GPU on Linux,
	# the CPU build from PyTorch's CPU index when it answers; else the default build (PyPI, or a local wheel).
	@torch=torch==$$(sed -n 's/^torch==//p' constraints.txt); \
	if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  if $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)' \
	       $(TORCH_CPU_INDEX) >/dev/null 2>&1; then \
	    echo "no NVIDIA GPU: installing $$torch's CPU build from $(TORCH_CPU_INDEX)"; \
	    $(PIP_INSTALL) --index-url $(TORCH_CPU_INDEX) $$torch || exit 1; \
	  else echo "no NVIDIA GPU, but $(TORCH_CPU_INDEX) cannot be reached: installing the default $$torch"; \
	    $(PIP_INSTALL) $$torch || exit 1; fi; \
	else echo "installing $$torch (PyPI's default build: CUDA 13.0 on Linux)"; $(PIP_INSTALL) $$torch || exit 1; fi
	$(PIP_INSTALL) -e ".[dev]" -e ./localcloud
	touch $@

venv: $(STAMP)

# Every notebook, headless, with papermill, into runs/demo-<time>/ (the runs they train go to runs/ too), one line
# per notebook with its time. Notebooks 04-05 and 07 submit to Vertex AI: offline, they run against localcloud/ (a
# Cloud Storage emulator and a fake of Vertex AI whose jobs really train in the trainer image's stand-in, built once
# per package version). notebooks/demo.py gives each notebook the PARAMS it declares (the YAML beside its executed
# copy), in one process; tests/executed_notebooks.py then reads the outputs.
demo: $(STAMP)
	$(BIN)/python -m localcloud -- $(MAKE) --no-print-directory demo-notebooks
demo-notebooks:
	@out=$$(pwd)/runs/demo-$$(date +%Y%m%d-%H%M%S); \
	$(BIN)/python notebooks/demo.py --out $$out --params $(PARAMS) && \
	$(BIN)/python tests/executed_notebooks.py $$out

# The trainer command alone, once: fine-tune + evaluate on the smoke profile.
train-smoke: $(STAMP)
	$(BIN)/python -m nli_helpers.task --profile smoke

# Throughput against the old recipe and Hugging Face Trainer, about 5 minutes (benchmarks/README.md).
bench: $(STAMP)
	$(REAL_DATA_ENV) $(BIN)/python benchmarks/train_throughput.py --quick --out runs/throughput.json

# The GPU check: a roberta-base-shaped model (random weights, no hub) in bf16, fp16 and HF Trainer on the GPU here
# (benchmarks/README.md). Without a GPU it stops with a message; `benchmarks/gpu_check.py --cpu-smoke` is the tiny version.
# It finds its data itself ($NLI_REAL_DATA, ../shared/data, else the bundled sample) and installs nothing: outside
# this venv (the trainer image, a Workbench environment) run the script with the [smoke,bench] extras installed.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --out runs/gpu_check.json

# Every install step of the trainer image resolved against the real registries for its platform (PyPI and Debian's
# index; what this machine cannot reach is named with its evidence). About a minute; .ci/run runs it.
image-check: $(STAMP)
	$(BIN)/python docker/image_check.py

# Debian's Chromium, which tests/test_jupyterlab_ui.py drives with playwright (never `playwright install`).
# Installed with apt when we are root and apt-get exists; otherwise a hint, and the test skips (fails in CI).
CHROMIUM := /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the JupyterLab UI test"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	  || echo "could not install chromium: tests/test_jupyterlab_ui.py will skip (fail in CI)"; \
	else \
	  echo "no $(CHROMIUM): tests/test_jupyterlab_ui.py will skip (fail in CI);" \
	       "install it with: sudo apt-get install --no-install-recommends chromium"; \
	fi

# Unit, integration and CLI tests, then every notebook under nbval (outputs stripped; asserts check).
# One pytest-xdist worker per core (WORKERS=0: no workers, one process); --dist loadfile keeps each file, and so each
# notebook's cells, in one worker, in order. conftest.py gives each worker its share of the cores.
# --no-loadscope-reorder keeps conftest.py's order (the slow files first), so both workers finish together.
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=900
WORKERS ?= auto
XDIST := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(REAL_DATA_ENV) $(BIN)/python -m pytest $(XDIST) --durations=25 tests notebooks $(NBVAL)

# The trainer command's contract, long: hypothesis draws EXAMPLES command lines and EXAMPLES/25 signals (README).
EXAMPLES ?= 3000
fuzz: $(STAMP)
	NLI_FUZZ_EXAMPLES=$(EXAMPLES) $(BIN)/python -m pytest -p no:cacheprovider tests/test_contract.py \
	  --hypothesis-show-statistics

test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check nli_helpers localcloud tests benchmarks conftest.py notebooks
	$(BIN)/lint-imports

# Re-pin after changing dependency ranges: the venv's exact versions become the constraints.
constraints: $(STAMP)
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
	  | grep -vi '^nli-helpers' | sed 's/^torch==\(.*\)+cpu/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache

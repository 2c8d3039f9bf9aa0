# Attention and Transformers: build the book and test it. `make` lists the targets.
# The first interpreter on PATH that the pins publish wheels for (requires-python in pyproject.toml; a
# test keeps the two ranges equal). Each is run, not just found: a pyenv shim exists without its Python.
PYTHONS  := python3.11 python3.12 python3.13 python3.14 python3
SUITABLE := import sys; sys.exit(not (3, 11) <= sys.version_info < (3, 15))
PYTHON   ?= $(firstword $(foreach p,$(PYTHONS),$(shell $(p) -c '$(SUITABLE)' >/dev/null 2>&1 && echo $(p))))
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?= $(sort $(wildcard notebooks/*.md))

.DEFAULT_GOAL := help
RUNS_PHONY = $(addsuffix .run,$(basename $(sort $(wildcard notebooks/*.md))))
.PHONY: $(RUNS_PHONY) help setup execute figures test check guarantees bench lab lab-test book student site serve site-test clean

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv with the pinned dependencies (fast when nothing changed)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || test -n "$(PYTHON)" || \
	  { echo "make setup needs Python 3.11, 3.12, 3.13 or 3.14 on PATH (as python3.11 ... python3.14 or python3)" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,site]'
	touch $@

# The .md is the source: touched first, it is the newer of the pair, so the sync takes its cells (keeping
# the .ipynb's cell ids) and executes them, as the book's build: every state of every control drawn for
# the site (BOOK_FRAMES=all) and every figure written to figures/ (BOOK_FIGURES; a reader's run does
# neither); book/clean.py strips what every run churns (timestamps,
# progress bars), and touching the .ipynb marks its outputs as the newer of the pair. Each notebook is
# a target of its own (notebooks/x.run), so `make -j2 execute` runs two side by side, each in its own kernel.
# NB may name a notebook by its .md, its .ipynb or neither ($(basename) would cut "9.1-x" to "9").
RUNS := $(addsuffix .run,$(patsubst %.ipynb,%,$(patsubst %.md,%,$(NB))))

execute: $(RUNS)  ## re-execute notebooks in fresh kernels and re-sync their pairs (NB=notebooks/x.md for one; -j2 runs two at once)

$(RUNS): %.run: $(STAMP)
	@test -f "$*.md" || { echo "no notebook $*.md (NB=notebooks/x.md)" >&2; exit 2; }
	@echo "executing $*"
	@touch "$*.md" && BOOK_FRAMES=all BOOK_FIGURES="$(CURDIR)/figures" $(BIN)/jupytext --sync --execute --quiet "$*.md"
	@$(BIN)/python book/clean.py "$*.ipynb"
	@touch "$*.ipynb"

figures: execute  ## write every figure to figures/ (the notebooks save them as they run)

# Two workers, a file each at a time (as make check): each notebook's nbval runs in one kernel on one core
# while the unit tests take the other; on one worker the suite took 9 to 14 minutes here, and CI has 30.
test: $(STAMP)  ## unit tests, pair sync, ruff, and nbval over every stored notebook
	$(BIN)/ruff check helpers tests notebooks book conftest.py
	$(BIN)/pytest -n 2 --dist loadfile

# One notebook, for the edit loop: nbval on its .ipynb, its pair and caption tests, the unit tests of
# the helpers modules it imports and its own section's checker tests (tests/check.py picks them), and ruff.
# Two workers: the notebook's cells in order on one (one group: conftest.py), the unit tests shared out one by one.
check: $(STAMP)  ## check one notebook fast: nbval, its pair and captions, its helpers' unit tests (NB=notebooks/x.md)
	@test "$(origin NB)" = "command line" || { echo "name the notebook: make check NB=notebooks/9.6-images-and-other-data.md" >&2; exit 2; }
	$(BIN)/ruff check helpers tests notebooks book conftest.py
	@# Two workers and the notebook's kernel share two cores: one thread each runs about 3 s faster than two each
	@# (the notebook's outputs hold on any thread count: make guarantees). Bytecode is cached between runs, as
	@# Python does by default, even where PYTHONDONTWRITEBYTECODE is set: pytest then rewrites the test modules'
	@# asserts once, not at every run (about 1.3 s a run). tests/plugins/quick.py spares each process an import and
	@# garbage collections that nothing here needs (about 3 s a run); the notebook runs as a reader's, writing no
	@# figure files (BOOK_FIGURES empty); tests/check.py leaves the reference solutions' tests to nbval.
	@args=$$($(BIN)/python tests/check.py $(NB)) && echo "pytest -q -p quick -n 2 --dist loadgroup $$args" && \
		OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE= BOOK_FIGURES= PYTHONPATH=tests/plugins \
		$(BIN)/pytest -q -p quick -n 2 --dist loadgroup $$args

guarantees: $(STAMP)  ## execute the chapter again under a simulated hardware matrix (CPU kernels, MKL, threads), offline; and the student edition
	$(BIN)/pytest -m chapter -n 2 --dist loadgroup tests/test_chapter.py tests/test_outside.py tests/test_student.py -v

bench: $(STAMP)  ## execution report: seconds and peak memory per notebook, against tests/budgets.toml
	$(BIN)/python tests/bench.py $(if $(filter command line,$(origin NB)),$(NB))

lab: $(STAMP)  ## open JupyterLab on the notebooks (with jupyterlab-myst, pinned in pyproject.toml, rendering their MyST)
	$(BIN)/jupyter lab notebooks

book: execute  ## execute the notebooks, write the figures, and build the site
	$(MAKE) --no-print-directory site

# The site is built from the stored notebooks (never re-executed) by Sphinx with book/conf.py. They are
# staged under _build/site/src with book/index.md (and README.md, which it includes), so Sphinx sees one
# source per page, not the jupytext .md twins; cp -p keeps their times, so a rebuild rereads only what changed.
# As Sphinx reads a notebook, book/captions.py moves each figure's caption from the markdown cell below it into
# the figure (on what Sphinx parses, not on the staged file, so its time and the site's download stay as they are).
# EDITION=student builds the student edition's site (make student writes its notebooks) into _build/site-student.
EDITION   ?= book
SITE      := _build/$(if $(filter student,$(EDITION)),site-student,site)
NOTEBOOKS := $(if $(filter student,$(EDITION)),_build/student/notebooks,notebooks)
NPM_STAMP := node_modules/.package-lock.json

$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

student: $(STAMP)  ## write the student edition (no solutions) to _build/student, the instructor's copy to _build/instructor
	$(BIN)/python book/student.py _build

site: $(STAMP) $(NPM_STAMP) $(if $(filter student,$(EDITION)),student)  ## build the site into _build/site/html from the stored notebooks (EDITION=student: the student edition's, into _build/site-student/html)
	rm -rf $(SITE)/src && mkdir -p $(SITE)/src/notebooks
	cp -p book/index.md README.md $(SITE)/src/ && cp -p $(NOTEBOOKS)/*.ipynb $(SITE)/src/notebooks/
	$(BIN)/sphinx-build -n -W --keep-going -q -b html -c book -d $(SITE)/doctrees $(SITE)/src $(SITE)/html
	@echo "site: $(SITE)/html/index.html"

serve: site  ## serve the site on http://127.0.0.1:8000 (PORT=...)
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory $(SITE)/html $(or $(PORT),8000)

# The link check (every relative link and #anchor of every page) is a test in book/test_site.py.
# EDITION=student opens the student edition's site (no screenshots: they are for a person to look at).
site-test: site  ## open every page in headless Chromium (apt's chromium) and check the site's links (EDITION=student: the student site)
	BOOK_EDITION=$(EDITION) $(BIN)/pytest -o addopts='-p no:cacheprovider' book/test_site.py \
	  $(if $(filter student,$(EDITION)),-k 'not screenshot')

lab-test: $(STAMP)  ## in JupyterLab (loopback port) and headless Chromium: notebooks unrun (one frame per control, no raw MyST), then Run All and every control moved
	$(BIN)/pytest -o addopts='-p no:cacheprovider' book/test_lab.py

clean:  ## remove the environment and build outputs (notebooks and figures stay)
	rm -rf $(VENV) node_modules _build .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

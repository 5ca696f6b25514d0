# Two entry points for a newcomer on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint docs bench-plan clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,mpich,bench,plugins,docs,pyg]'
	# Compile solar's numba kernels into the cache once, here, not inside a first epoch.
	$(BIN)/solar warm --jobs 2
	touch $@

demo: $(STAMP)
	$(BIN)/solar demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	# Two workers (pytest-xdist, the dev extra): tests/conftest.py puts every test that launches
	# jobs of several ranks in one group, run one at a time by one worker (--dist loadgroup),
	# while the other takes the rest. ~6 min instead of ~8 on 2 cores.
	$(BIN)/pytest -q -n 2 --dist loadgroup

# The documentation site, from docs/ and mkdocs.yml, into site/ (warnings are errors).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench-plan: $(STAMP)
	$(BIN)/python bench/plan_bench.py --json bench/results/plan.json

clean:
	rm -rf $(VENV) .demo build site *.egg-info

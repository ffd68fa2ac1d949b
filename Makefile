# Developer tasks for asgi_amqp (GNU make). `make help` lists them.
#
# The broker is $AMQP_URL if set, else a Docker container if a Docker engine
# answers, else a private RabbitMQ node started from the machine's
# rabbitmq-server (devtools/rabbitmq.py); the system broker is never used
# unless AMQP_URL points at it. System packages come from devtools/install.py.

PYTHON ?= python3
VENV ?= .venv
REDIS_VENV ?= .venv-redis
PYTEST_ARGS ?=
BENCH_ARGS ?=
REPORT_ARGS ?=
DEMO_ARGS ?=
CHANNELS_BENCH_ARGS ?=
ECHO_ARGS ?=
FAULTS_ARGS ?= --duration 60 --scenario both
SOAK_ARGS ?= --minutes 30

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_PATHS := asgi_amqp tests conformance devtools examples benchmarks conftest.py setup.py
BENCH = $(VPY) -m benchmarks --redis-python $(REDIS_VENV)/bin/python

.DEFAULT_GOAL := help
.PHONY: help venv broker-deps e2e-deps redis-deps redis-venv check quick test lint docs demo \
        demo-basic bench bench-report bench-channels bench-echo faults faults-stack leaks soak clean distclean

help: ## this list
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | \
	    awk 'BEGIN {FS = ":.*## "}; {printf "  make %-15s %s\n", $$1, $$2}'
	@echo "variables: PYTEST_ARGS BENCH_ARGS REPORT_ARGS DEMO_ARGS CHANNELS_BENCH_ARGS"
	@echo "           ECHO_ARGS FAULTS_ARGS='$(FAULTS_ARGS)' SOAK_ARGS='$(SOAK_ARGS)'"
	@echo "           PYTHON VENV REDIS_VENV"

venv: $(STAMP) ## the project's virtualenv (.venv), installed editable

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.py | $(VPY)
	$(VPY) -m pip install -e '.[test,spark,channels,browser]'
	touch $@

# make check and make lint need the test extra and Twisted (mypy checks
# twisted_support.py against it), no Spark, Channels or browser: a stamp of
# their own, which the full install above includes.
CHECK_STAMP := $(VENV)/.check-installed
$(CHECK_STAMP): setup.py | $(VPY)
	$(VPY) -m pip install -e '.[test,twisted]'
	touch $@

$(VENV)/.%-installed: $(STAMP)
	$(VPY) -m pip install -e '.[$*]'
	touch $@

# The demos need the package and the channels extra only (no test, Spark or
# browser set-up): a stamp of their own, not the development install's.
DEMO_STAMP := $(VENV)/.demo-installed
$(DEMO_STAMP): setup.py | $(VPY)
	$(VPY) -m pip install -e '.[channels]'
	touch $@

broker-deps: | $(VPY) ## rabbitmq-server for private nodes (unless AMQP_URL or Docker)
	$(VPY) -m devtools.install broker

e2e-deps: venv ## chromium and chromedriver for the browser test
	$(VPY) -m devtools.install browser

redis-deps: venv ## a Redis for the benchmarks' asgi_redis (optional)
	$(VPY) -m devtools.install --optional redis

# The suite runs once per RabbitMQ version it can start (devtools/test_brokers.py):
# Debian's rabbitmq-server, and a server directory plus an Erlang given by
# ASGI_AMQP_RABBITMQ_SERVER_DIR and ASGI_AMQP_ERLANG_ROOT (see devtools/rabbitmq.py),
# the two side by side, never two tests marked heavy at once, and those marked
# alone with nothing beside them. Then Python 3.9 and 3.13 (Debian's, built as
# root by devtools/pythons.py) run the broker-free tier, the conformance, CLI
# and chat end-to-end tests.
test: venv broker-deps e2e-deps lint docs ## lint, docs and every test on every broker version (PYTEST_ARGS='-k foo')
	$(VPY) -m devtools.test_brokers $(PYTEST_ARGS)

# The tests that need no broker and no heavy extra: not marked `broker`
# (conftest.py marks every test that uses the session broker or a private
# node) nor `extras` (Spark and Channels are not installed for them; make
# test runs them). No AMQP_URL reaches
# them, and ASGI_AMQP_NO_BROKER makes a broker start-up an error that names
# the marker, so an unmarked broker test fails here instead of starting one.
check: lint ## lint, types, import contracts and the broker-free tests (< 90 s)
	env -u AMQP_URL -u AMQP_MANAGEMENT_URL ASGI_AMQP_NO_BROKER=1 \
	    $(VPY) -m pytest -m 'not broker and not extras' -q $(PYTEST_ARGS)

# The developer's loop: pytest once, on AMQP_URL if set (else on a private
# node for the run), with no installs, lint or docs first.
quick: ## just the tests, on AMQP_URL or a private node, no set-up (PYTEST_ARGS='-k groups')
	$(VPY) -m pytest $(PYTEST_ARGS)

lint: $(CHECK_STAMP) ## ruff check, ruff format --check, mypy, import contracts (pyproject.toml)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy asgi_amqp
	$(VENV)/bin/lint-imports

docs: venv $(VENV)/.docs-installed ## the Sphinx docs, warnings as errors (docs/_build/html)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

demo: $(DEMO_STAMP) broker-deps ## the chat example on a real broker (DEMO_ARGS=--once)
	$(VPY) -m devtools.rabbitmq run -- $(VPY) examples/chat_demo.py $(DEMO_ARGS)

demo-basic: $(DEMO_STAMP) broker-deps ## examples/demo.py: two processes, no Django
	$(VPY) -m devtools.rabbitmq run -- $(VPY) examples/demo.py

$(REDIS_VENV)/.installed: benchmarks/requirements-redis.txt
	test -x $(REDIS_VENV)/bin/python || $(PYTHON) -m venv $(REDIS_VENV)
	$(REDIS_VENV)/bin/python -m pip install -r benchmarks/requirements-redis.txt
	$(REDIS_VENV)/bin/python -m pip install --no-deps 'asgi_redis==1.4.3'
	touch $@

redis-venv: $(REDIS_VENV)/.installed ## asgi_redis 1.4.3 in its own virtualenv

bench: venv broker-deps redis-deps redis-venv $(VENV)/.bench-installed ## every benchmark (BENCH_ARGS='--only echo')
	$(VPY) -m devtools.install --optional java
	$(BENCH) $(BENCH_ARGS)

bench-report: $(VENV)/.bench-installed ## re-aggregate the latest run (REPORT_ARGS)
	$(VPY) benchmarks/report_spark.py $(REPORT_ARGS)

bench-channels: venv broker-deps redis-deps redis-venv $(VENV)/.bench-installed ## = bench --only channels
	$(BENCH) --only channels $(CHANNELS_BENCH_ARGS)

bench-echo: venv broker-deps redis-deps redis-venv $(VENV)/.bench-installed ## = bench --only echo
	$(BENCH) --only echo $(ECHO_ARGS)

faults-stack: venv broker-deps ## the Channels stack through broker faults (FAULTS_ARGS)
	$(VPY) tests/project/stackfaults.py $(FAULTS_ARGS)

# Every fault kind for 180 s each, at the layer's default settings with two
# runworkers on every channel and 20 clients at 5 messages/s each (the
# outage issue's chat): kills, restart and alarm for both queue types, and
# the loss of a cluster node with quorum queues; the restart again with four
# runworkers and the management plugin. At 10 messages/s each with kills,
# a 2-core machine running the broker, daphne and two workers is saturated
# (load average 4): shards filled to their capacity of 100 and daphne's
# frames for them expired after 60 s, wherever the shards were. FAULTS_ARGS,
# when given, comes last and overrides (e.g. FAULTS_ARGS='--duration 60').
# Then a restart whose 30 s pause outlasts the processes' operation_timeout
# (5 s), and a connect storm of 800 WebSockets, for both queue types.
faults: venv broker-deps ## every fault kind, 3 minutes each (about 36 min in all; FAULTS_ARGS overrides)
	$(VPY) tests/project/stackfaults.py --scenario all --duration 180 --rate 5 \
	    $(if $(filter command line environment,$(origin FAULTS_ARGS)),$(FAULTS_ARGS))
	$(VPY) tests/project/stackfaults.py --scenario restart --duration 180 --rate 5 --workers 4 \
	    --management-plugin
	$(VPY) tests/project/stackfaults.py --scenario restart --duration 90 --rate 5 \
	    --restart-pause 30 --operation-timeout 5 --management-plugin
	ASGI_AMQP_STORM_SOCKETS=800 $(VPY) -m pytest -s tests/e2e/test_connect_storm.py

leaks: venv broker-deps ## the no-leak test at full size: 10k channels, 1k groups, 1k local (minutes)
	ASGI_AMQP_LEAK_SIZES=full $(VPY) -m pytest -s tests/test_no_broker_leaks.py $(PYTEST_ARGS)

soak: venv broker-deps $(VENV)/.soak-installed ## mixed traffic and connection kills, bounds on growth (SOAK_ARGS)
	$(VPY) -m devtools.soak $(SOAK_ARGS)

clean: ## caches and build output
	rm -rf build dist .eggs .pytest_cache .hypothesis .mypy_cache .ruff_cache htmlcov \
	    .coverage .coverage.* docs/_build
	find . \( -path ./.git -o -path './$(VENV)' \) -prune -o \
	    \( -name '*.egg-info' -o -name __pycache__ \) -prune -exec rm -rf {} + -o \
	    -name '*.py[co]' -exec rm -f {} +

distclean: clean ## clean, and the virtualenvs
	rm -rf $(VENV) $(REDIS_VENV)

SIZING_ARGS ?= --cluster
.PHONY: sizing
sizing: venv broker-deps ## broker memory, fds and CPU per layer object (SIZING_ARGS; minutes)
	$(VPY) -m devtools.sizing $(SIZING_ARGS)

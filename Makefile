# Developer tasks for asgi_amqp (GNU make).
#
#   make test [PYTEST_ARGS='-k foo -x']   tests against a real broker
#   make demo                             examples/demo.py against a real broker
#   make bench [BENCH_ARGS=...]           benchmarks/run.py against a real broker
#
# The broker is $AMQP_URL if set, else a Docker container if a Docker engine
# answers, else a private RabbitMQ node started from the machine's
# rabbitmq-server (see devtools/rabbitmq.py).  The system broker is never used
# unless AMQP_URL points at it.

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=
BENCH_ARGS ?=

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PACKAGE_META := $(wildcard setup.py setup.cfg pyproject.toml)
# The interpreter that decides whether a Docker engine would be used.
BROKER_PY = $(if $(wildcard $(VPY)),$(VPY),$(PYTHON))

.DEFAULT_GOAL := help
.PHONY: help venv broker-deps test demo bench clean distclean

help:
	@echo "targets: venv broker-deps test demo bench clean distclean"
	@echo "variables: PYTHON=$(PYTHON) VENV=$(VENV) PYTEST_ARGS=... BENCH_ARGS=..."

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Re-install only when the package metadata is newer than the stamp.
$(STAMP): $(PACKAGE_META) | $(VPY)
	$(VPY) -m pip install -e '.[test]'
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

test: venv broker-deps
	$(VPY) -m pytest $(PYTEST_ARGS)

demo: venv broker-deps
	$(VPY) -m devtools.rabbitmq run -- $(VPY) examples/demo.py

bench: venv broker-deps
	$(VPY) -m devtools.rabbitmq run -- $(VPY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist .eggs .pytest_cache .hypothesis .mypy_cache .ruff_cache htmlcov .coverage .coverage.*
	find . \( -path ./.git -o -path './$(VENV)' \) -prune -o \
	    \( -name '*.egg-info' -o -name __pycache__ \) -prune -exec rm -rf {} + -o \
	    -name '*.py[co]' -exec rm -f {} +

distclean: clean
	rm -rf $(VENV)

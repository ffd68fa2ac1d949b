import io
import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read(name):
    with io.open(os.path.join(HERE, name), encoding="utf8") as handle:
        return handle.read()


version = re.search(r'^__version__ = "([^"]+)"', read("asgi_amqp/__init__.py"), re.M).group(1)

setup(
    # The name asgi_amqp on the package index belongs to an unrelated, older
    # project; the import package is still asgi_amqp.
    name="asgi-amqp-layer",
    version=version,
    description="A synchronous ASGI 1.0 channel layer (Channels 1.x) on RabbitMQ",
    long_description=read("README.rst"),
    long_description_content_type="text/x-rst",
    license="BSD-3-Clause",
    packages=find_packages(include=["asgi_amqp", "asgi_amqp.*"]),
    package_data={"asgi_amqp": ["py.typed"]},
    # CI runs Python 3.11 (Debian 12's), and 3.9 and 3.13 (Debian 11's and
    # 13's, devtools/pythons.py): the claim is what is tested.
    python_requires=">=3.9",
    install_requires=[
        "pika>=1.3,<2",
        "msgpack>=1.0,<2",
        "asgiref==1.1.2",
        # The asgi-amqp command is a core use case: a plain install runs it.
        "click>=8.0",
        "tqdm>=4",
        "rich>=13",  # asgi-amqp top
        "tomli>=1.1; python_version < '3.11'",  # tomllib before 3.11 (layerconfig)
    ],
    extras_require={
        "crypto": ["cryptography>=3.4"],
        # asgi-amqp metrics, the Prometheus endpoint: one process per
        # deployment runs it, not every process that imports the layer.
        "metrics": ["prometheus-client>=0.17"],
        "test": [
            "pytest>=7",
            "hypothesis>=6",
            "cryptography>=3.4",
            "docker>=6",
            "websocket-client>=1.0",
            "prometheus-client>=0.17",  # tests/test_metrics.py
            # make lint (run by make check and make test): pinned, so that a
            # new release's rules cannot fail a clean checkout.
            "ruff==0.17.6",
            "mypy==2.4.1",
            "types-pika==1.2.0b1",
            "import-linter==2.17",
        ],
        "spark": ["pyspark>=3.4"],
        "browser": ["selenium>=4.10"],  # tests/e2e/test_channels_browser.py
        "twisted": ["twisted"],
        "channels": [
            "channels==1.1.8",
            "daphne==1.4.2",
            "Django==2.2.28",
            "twisted",
            "autobahn",
            "websocket-client>=1.0",  # the chat demo's scripted users (make demo)
            # Django 2.2 on Python 3.12+: distutils (setuptools brings it) and,
            # from 3.13 on, cgi (docs/compatibility.rst).
            "setuptools; python_version >= '3.12'",
            "legacy-cgi; python_version >= '3.13'",
        ],
        "soak": ["matplotlib"],  # make soak's chart
        "bench": ["tqdm", "pyarrow", "matplotlib", "pyspark>=3.5"],
        "docs": ["sphinx>=7", "furo", "sphinx-click>=5", "click>=8.0"],
    },
    entry_points={"console_scripts": ["asgi-amqp=asgi_amqp.tools.console:main"]},
    classifiers=[
        "Framework :: Django",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: System :: Networking",
    ],
)

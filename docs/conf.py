"""Sphinx configuration for the asgi_amqp documentation (``make docs``)."""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The package is installed in the project venv; this also lets a plain
# checkout build the API reference.
sys.path.insert(0, ROOT)

with open(os.path.join(ROOT, "asgi_amqp", "__init__.py"), encoding="utf8") as handle:
    release = re.search(r'^__version__ = "([^"]+)"', handle.read(), re.M).group(1)
version = release

project = "asgi_amqp"
author = "the asgi_amqp authors"
copyright = "the asgi_amqp authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx_click",
]

# asgi_amqp.spark imports pyspark at import time; the API reference only
# needs its docstrings, so a machine without pyspark still builds the docs.
try:
    import pyspark  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["pyspark"]

autodoc_member_order = "bysource"
autodoc_typehints = "none"

exclude_patterns = ["_build"]
templates_path = []
html_static_path = []

html_theme = "furo"
html_title = "asgi_amqp %s" % release

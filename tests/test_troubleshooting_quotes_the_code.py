"""docs/troubleshooting.rst quotes the errors as the layer words them.

Every line of the page's ``code-block:: text`` blocks reads ``Name:
message``: ``Name`` must be one of the layer's exceptions, the message one
of the layer's own format strings (with 15 characters of its own at
least) with its ``%`` fields filled in, and a quarter of it at least the
layer's own words. The strings are read from the source with ``ast``,
where adjacent literals are already joined. So a user who searches for the
text finds the page, and the code raises what the page says.
"""

import ast
import os
import re
from typing import List, Pattern, Tuple

import asgi_amqp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "troubleshooting.rst")
PACKAGE = os.path.dirname(asgi_amqp.__file__)
_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfi]")


def quoted_errors() -> List[Tuple[str, str]]:
    """(exception name, message) of every line of the page's text blocks."""
    with open(PAGE, encoding="utf-8") as page:
        lines = page.read().splitlines()
    quoted = []
    in_block = False
    for line in lines:
        if line.startswith(".. code-block:: text"):
            in_block = True
        elif in_block and line and not line.startswith(" "):
            in_block = False
        elif in_block and line.strip():
            name, _, message = line.strip().partition(": ")
            quoted.append((name, message))
    return quoted


def code_strings() -> Tuple[List[Pattern[str]], List[str]]:
    """The package's string literals: those with a ``%`` field as patterns
    whose fields match any text, and every literal piece between fields
    (8 characters or more)."""
    patterns, pieces = [], set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as source:
                tree = ast.parse(source.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    parts = _FIELD.split(node.value.replace("%%", "\0"))
                    parts = [part.replace("\0", "%") for part in parts]
                    pieces.update(part for part in parts if len(part) >= 8)
                    # A form with fields and 15 characters of its own at least.
                    if len(parts) > 1 and len("".join(parts)) >= 15:
                        literal = [re.escape(part) for part in parts]
                        patterns.append(re.compile("(?s)" + "(.+?)".join(literal)))
    return patterns, sorted(pieces)


def covered(message: str, pieces: List[str]) -> float:
    """The share of ``message`` made of the code's literal pieces."""
    mask = [False] * len(message)
    for piece in pieces:
        start = message.find(piece)
        while start != -1:
            mask[start : start + len(piece)] = [True] * len(piece)
            start = message.find(piece, start + 1)
    return sum(mask) / len(message)


def test_the_page_quotes_errors():
    names = {name for name, _ in quoted_errors()}
    # One entry per kind of trouble the page covers, at least.
    assert {
        "ChannelFull",
        "MessageRefused",
        "QueueSettingsMismatch",
        "BrokerBlocked",
        "BrokerOperationError",
        "AuthenticationError",
        "OperationTimeout",
        "ManagementAPIError",
    } <= names


def test_every_quoted_error_is_the_layers():
    patterns, pieces = code_strings()
    for name, message in quoted_errors():
        error = getattr(asgi_amqp, name, None)
        assert isinstance(error, type) and issubclass(error, Exception), name
        # One of the layer's forms makes the whole message, and most of its
        # text is the layer's own words (the rest: names, figures, the
        # broker's reply).
        assert any(p.fullmatch(message) for p in patterns), (name, message)
        assert covered(message, pieces) >= 0.25, (name, message, covered(message, pieces))

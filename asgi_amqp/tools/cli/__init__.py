"""The ``asgi-amqp`` command: send, receive, groups, flush, statistics, top,
metrics and permissions.

Run ``asgi-amqp --help`` (or ``python -m asgi_amqp --help``). A plain install
has what it needs, but ``metrics``: ``pip install 'asgi-amqp-layer[metrics]'``.

One module per command family; ``base`` holds the group, the global options
and the error handling they share.
"""

from typing import Any, Optional, Sequence

from . import groups, metrics, permissions, queues, receive, send, stats, top  # noqa: F401
from .base import PROG, cli

__all__ = ["cli", "main"]


def main(argv: Optional[Sequence[str]] = None) -> Any:
    """The ``asgi-amqp`` console script."""
    return cli.main(args=argv, prog_name=PROG)

"""The ``asgi-amqp`` console script's entry point.

It imports the command (click and the layer) inside a ``try``, so that a
broken installation ends in one line on stderr and exit status 2, never an
ImportError traceback.
"""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    try:
        from .cli import main as run
    except ImportError as exc:
        sys.stderr.write(
            "asgi-amqp: error: cannot start: %s (reinstall: pip install asgi-amqp-layer)\n" % exc
        )
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m asgi_amqp``: the ``asgi-amqp`` command (see asgi_amqp/tools/cli/)."""

import sys

try:
    from .tools.cli import main
except ImportError as exc:  # click is an optional dependency: the [cli] extra
    sys.stderr.write("asgi-amqp: %s\n" % exc)
    sys.exit(2)

if __name__ == "__main__":
    main()

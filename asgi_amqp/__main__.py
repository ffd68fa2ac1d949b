"""``python -m asgi_amqp``: the ``asgi-amqp`` command (see asgi_amqp/tools/cli/)."""

from .tools.cli import main

if __name__ == "__main__":
    main()

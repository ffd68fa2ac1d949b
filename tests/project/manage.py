#!/usr/bin/env python
"""Django's command-line utility for the chat example project (runworker, check, ...)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

if __name__ == "__main__":
    # The project directory and the repository root (for asgi_amqp when it is
    # not installed) are importable wherever this is run from.
    for path in (ROOT, HERE):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

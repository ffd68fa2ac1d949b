"""The channel layer daphne serves: ``daphne chatproject.asgi:channel_layer``.

Run from ``tests/project`` (or with it on ``PYTHONPATH``).
"""

import os

from channels.asgi import get_channel_layer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")

channel_layer = get_channel_layer()

"""Benchmarks of asgi_amqp: the layer side by side with asgi_redis and raw pika,
bulk sends, Channels end to end, and one worker echoing.

Run ``python -m benchmarks --help`` (``make bench``); see ``benchmarks/README.md``.
"""

"""Side-by-side benchmarks of asgi_amqp against raw pika (and, later, peers).

Run ``python benchmarks/run.py --help``; see ``benchmarks/README.md``.
"""

"""``asgi_amqp.spark.send_dataframe``, the Spark sender's public import path.

The code lives in ``asgi_amqp.tools.spark``; see its docstring.
"""

from .tools.spark import SendResult, send_dataframe

__all__ = ["SendResult", "send_dataframe"]

"""Tools built on the layer's public API: the ``asgi-amqp`` command line
(``cli``), the Spark sender (``spark``, the driver's side; ``spark_messages``,
rows to messages; ``spark_partition``, each executor's sends) and the bulk-send
engine they share (``bulk``). Nothing in the layer or the engine imports them."""

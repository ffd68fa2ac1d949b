"""Tools built on the layer's public API: the ``asgi-amqp`` command line
(``cli``), the Spark sender (``spark``) and the bulk-send engine they share
(``bulk``). Nothing in the layer or the engine imports them."""

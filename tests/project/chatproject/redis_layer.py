"""asgi_redis 1.4.3 usable beside msgpack 1.x (for the comparison benchmark).

asgi_redis 1.4.3 calls ``msgpack.unpackb(message, encoding="utf8")``;
msgpack 1.0 removed ``encoding``, and its old ``msgpack-python`` dependency
cannot share a virtualenv with msgpack 1.x (which autobahn, a daphne
dependency, requires). Install asgi_redis with ``--no-deps`` next to msgpack
1.x and use this class: the same layer, decoding with ``raw=False``.
"""

import msgpack
from asgi_redis import RedisChannelLayer as _RedisChannelLayer


class RedisChannelLayer(_RedisChannelLayer):
    def deserialize(self, message):
        if self.crypter:
            message = self.crypter.decrypt(message, self.expiry + 10)
        return msgpack.unpackb(message, raw=False)

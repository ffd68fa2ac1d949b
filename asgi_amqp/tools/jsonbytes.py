"""JSON for ASGI messages, shared by the command line and the Spark sender.

JSON has no bytes, so a bytes value travels as ``{"__bytes__": "<base64>"}``;
an object whose only key is ``__bytes__`` always means bytes.
"""

import base64
import binascii
import json

BYTES_KEY = "__bytes__"


def _decode_bytes(obj):
    if len(obj) == 1 and BYTES_KEY in obj:
        value = obj[BYTES_KEY]
        if not isinstance(value, str):
            raise ValueError("%s must hold a base64 string" % BYTES_KEY)
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError("%s holds invalid base64" % BYTES_KEY)
    return obj


def loads(text):
    """JSON text -> Python, with ``{"__bytes__": base64}`` turned into bytes."""
    return json.loads(text, object_hook=_decode_bytes)


def _encode_bytes(value):
    if isinstance(value, bytes):
        return {BYTES_KEY: base64.b64encode(value).decode("ascii")}
    raise TypeError("%s is not JSON serializable" % type(value).__name__)


def dumps(value):
    """Python -> one line of JSON, bytes as ``{"__bytes__": base64}``."""
    return json.dumps(value, default=_encode_bytes, ensure_ascii=False, separators=(",", ":"))

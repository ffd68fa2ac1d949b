"""JSON for ASGI messages, shared by the command line and the Spark sender.

JSON has no bytes and no NaN or infinities (strict parsers such as jq and
JavaScript's ``JSON.parse`` refuse Python's ``NaN`` and ``Infinity``), so
two objects stand for them:

* ``{"__bytes__": "<base64>"}``: a bytes value;
* ``{"__float__": "nan"}``, ``{"__float__": "inf"}``, ``{"__float__": "-inf"}``:
  a float that JSON cannot carry.

An object whose only key is ``__bytes__`` or ``__float__`` always means one
of these. ``dumps`` writes strict JSON only; ``loads`` reads both forms back
(and, leniently, the non-standard ``NaN`` and ``Infinity`` tokens).
"""

import base64
import binascii
import json
import math
from typing import Any, Dict, Union

BYTES_KEY = "__bytes__"
FLOAT_KEY = "__float__"
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _decode_special(obj: Dict[str, Any]) -> Any:
    if len(obj) != 1:
        return obj
    if BYTES_KEY in obj:
        value = obj[BYTES_KEY]
        if not isinstance(value, str):
            raise ValueError("%s must hold a base64 string" % BYTES_KEY)
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError("%s holds invalid base64" % BYTES_KEY)
    if FLOAT_KEY in obj:
        value = obj[FLOAT_KEY]
        if value not in _FLOATS:
            raise ValueError('%s must hold "nan", "inf" or "-inf", not %r' % (FLOAT_KEY, value))
        return _FLOATS[value]
    return obj


# One decoder for every call: ``json.loads`` with an ``object_hook`` builds a new one
# each time, for every line of a bulk send.
_DECODER = json.JSONDecoder(object_hook=_decode_special)


def loads(text: Union[str, bytes]) -> Any:
    """JSON text -> Python, with the ``__bytes__`` and ``__float__`` objects decoded.

    Nesting deeper than Python's parser can follow (about 1,000 levels, over 5,000 on 3.13) is a
    ValueError like any other bad JSON, not a RecursionError.
    """
    try:
        if isinstance(text, str) and not text.startswith("\ufeff"):
            return _DECODER.decode(text)
        # bytes, a BOM or another type: json.loads reads or refuses them
        return json.loads(text, object_hook=_decode_special)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def _special_float(value: float) -> Dict[str, str]:
    if math.isnan(value):
        return {FLOAT_KEY: "nan"}
    return {FLOAT_KEY: "inf" if value > 0 else "-inf"}


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its ``__float__`` object."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _special_float(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def _encode_bytes(value: object) -> Dict[str, str]:
    if isinstance(value, bytes):
        return {BYTES_KEY: base64.b64encode(value).decode("ascii")}
    raise TypeError("%s is not JSON serializable" % type(value).__name__)


def dumps(value: Any) -> str:
    """Python -> one line of strict JSON, bytes and non-finite floats as objects."""
    return json.dumps(
        _strict(value),
        default=_encode_bytes,
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )

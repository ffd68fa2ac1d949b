"""Message validation, msgpack encoding and optional Fernet encryption.

Validation runs in the caller's thread, so bad input never reaches the broker
and the error names the offending key.
"""

import logging
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import msgpack

from .errors import MessageTooLarge

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

logger = logging.getLogger(__name__)

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
MAX_DEPTH = 64

Message = Dict[str, Any]  # an ASGI message: a dict of msgpack-able values
_SCALARS = (str, bytes, bool, float, type(None))


class UndecodableMessage(ValueError):
    """A body on the broker that this layer cannot turn back into a message."""


def _path(parent: str, key: Union[str, int]) -> str:
    return "%s[%r]" % (parent, key)


def validate_message(message: object) -> None:
    """Raise TypeError unless ``message`` is a dict of ASGI-serializable values.

    ASGI messages are dicts with str keys whose values are str, bytes, int,
    float, bool, None, lists (tuples are sent as lists) and dicts of these.
    """
    if not isinstance(message, dict):
        raise TypeError("message must be a dict, not %s" % type(message).__name__)
    if type(message) is dict and _plainly_valid(message, 0):
        return
    _validate_value(message, "message", 0)


_PLAIN_SCALARS = frozenset((str, bytes, bool, float, type(None)))
_PLAIN_CONTAINERS = frozenset((dict, list, tuple))


def _plainly_valid(
    container: Union[Dict[Any, Any], List[Any], Tuple[Any, ...]], depth: int
) -> bool:
    """True when ``container`` holds only the exact built-in types ASGI allows.

    Every send's cheap common case. False means "look closer", not "invalid":
    ``_validate_value`` then decides, and names the offending key.
    """
    if depth >= MAX_DEPTH:
        return False
    items: Iterable[Any] = container
    if type(container) is dict:
        for key in container:
            if type(key) is not str:
                return False
        items = container.values()
    for item in items:
        kind = type(item)
        if kind in _PLAIN_SCALARS or (kind is int and INT_MIN <= item <= INT_MAX):
            continue
        if kind not in _PLAIN_CONTAINERS or not _plainly_valid(item, depth + 1):
            return False
    return True


def _validate_value(value: object, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("%s is nested more than %d levels deep" % (where, MAX_DEPTH))
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(
                "%s: integer %d is outside the range msgpack can carry" % (where, value)
            )
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    "%s has the key %r of type %s; keys must be str"
                    % (where, key, type(key).__name__)
                )
            _validate_value(item, _path(where, key), depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _validate_value(item, _path(where, index), depth + 1)
        return
    raise TypeError(
        "%s has a value of type %s, which ASGI messages cannot carry"
        % (where, type(value).__name__)
    )


class Serializer(object):
    """Turns validated messages into bodies and back, enforcing the size limit."""

    def __init__(
        self,
        max_message_size: int,
        symmetric_encryption_keys: Optional[Sequence[Union[str, bytes]]] = None,
    ) -> None:
        self.max_message_size = max_message_size
        self._crypter = _make_crypter(symmetric_encryption_keys)

    def dumps(self, message: Message) -> bytes:
        validate_message(message)
        try:
            body = msgpack.packb(message, use_bin_type=True)
        except UnicodeEncodeError as exc:
            raise ValueError(
                "message holds a string that is not valid Unicode text "
                "(a lone surrogate?): %s" % exc
            ) from None
        if self._crypter is not None:
            body = self._crypter.encrypt(body)
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                "message is %d bytes encoded; the limit (max_message_size) is %d"
                % (len(body), self.max_message_size)
            )
        return body

    def loads(self, body: bytes) -> Message:
        if self._crypter is not None:
            body = _decrypt(self._crypter, body)
        try:
            message = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise UndecodableMessage("body is not a msgpack message: %s" % exc)
        if not isinstance(message, dict):
            raise UndecodableMessage("body decodes to %s, not a dict" % type(message).__name__)
        return message


def _decrypt(crypter: "MultiFernet", body: bytes) -> bytes:
    from cryptography.fernet import InvalidToken

    try:
        return crypter.decrypt(body)
    except (InvalidToken, TypeError):
        raise UndecodableMessage("body was not encrypted with any configured key")


def _make_crypter(keys: Optional[Sequence[Union[str, bytes]]]) -> Optional["MultiFernet"]:
    if not keys:
        return None
    if isinstance(keys, (str, bytes)):
        raise TypeError("symmetric_encryption_keys must be a list of keys, not one key")
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError:
        raise ImportError(
            "symmetric_encryption_keys needs the 'cryptography' package: "
            "pip install 'asgi-amqp-layer[crypto]'"
        )
    return MultiFernet([Fernet(_fernet_key(key)) for key in keys])


def _fernet_key(key: Union[str, bytes]) -> bytes:
    """A Fernet key as it is, or any other secret (a SECRET_KEY) stretched with SHA-256,
    as asgi_redis does."""
    import base64
    import hashlib

    raw = key.encode("utf8") if isinstance(key, str) else key
    try:
        if len(base64.urlsafe_b64decode(raw)) == 32:
            return raw
    except Exception:
        pass
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest())

"""The rejects file of a bulk send: every line that was not sent, to resume from.

Each line of it is one JSON object::

    {"line": 5001, "kind": "refused", "reason": "...", "original": "<the input line>"}

``line`` is the line's number in the first run's input (a resume keeps it),
``kind`` one of ``bulk.REFUSED``, ``IN_DOUBT`` and ``NOT_SENT``, and
``original`` the line as it was read, without its line end (``original_base64``
instead for a line that is not UTF-8). ``asgi-amqp send --from`` reads such a
record as its original line, so the rejects file is the resume. It is
written beside its path and moved into place when the run ends, so a
rejects file is never half written, and a resume may write over the file
it reads.
"""

import base64
import binascii
import os
import tempfile
from typing import IO, Any, Dict, Optional, Tuple

from .bulk import IN_DOUBT, NOT_SENT, REFUSED
from .jsonbytes import dumps

KEYS = frozenset(["line", "kind", "reason", "original", "original_base64"])
REJECTED_KINDS = (REFUSED, IN_DOUBT, NOT_SENT)


class RejectError(ValueError):
    """A record that looks like a rejects record but is not a valid one."""


def record(number: int, kind: str, reason: str, raw: bytes) -> str:
    """One line of a rejects file (without its line end)."""
    entry: Dict[str, Any] = {"line": number, "kind": kind, "reason": reason}
    original = raw.rstrip(b"\r\n")
    try:
        entry["original"] = original.decode("utf-8")
    except UnicodeDecodeError:
        entry["original_base64"] = base64.b64encode(original).decode("ascii")
    return dumps(entry)


def is_record(value: Any) -> bool:
    """True for a parsed JSON value that is a rejects record (not a message line)."""
    return isinstance(value, dict) and "line" in value and "kind" in value


def unwrap(value: Dict[str, Any]) -> Tuple[int, str, bytes]:
    """(line number, kind, original line) of a parsed rejects record."""
    unknown = set(value) - KEYS
    if unknown:
        raise RejectError("a rejects record with unknown key(s): %s" % ", ".join(sorted(unknown)))
    number, kind = value["line"], value["kind"]
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise RejectError('a rejects record\'s "line" must be a positive integer')
    if kind not in REJECTED_KINDS:
        raise RejectError(
            'a rejects record\'s "kind" must be one of %s, not %r'
            % (", ".join(REJECTED_KINDS), kind)
        )
    if isinstance(value.get("original"), str):
        return number, kind, value["original"].encode("utf-8")
    if isinstance(value.get("original_base64"), str):
        try:
            return number, kind, base64.b64decode(value["original_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise RejectError('a rejects record\'s "original_base64" is not base64') from None
    raise RejectError('a rejects record needs "original" or "original_base64"')


class RejectsFile(object):
    """Records written to a temporary file beside ``path``, moved there by ``finish``.

    The temporary file is made on the first record. ``finish(keep_empty)``
    moves it into place; with no record it writes an empty file only if
    ``keep_empty`` (a rejects file that would otherwise still list lines a
    later run sent). ``discard`` drops what was written.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._handle: Optional[IO[str]] = None
        self._temporary: Optional[str] = None

    def write(self, number: int, kind: str, reason: str, raw: bytes) -> None:
        if self._handle is None:
            self._handle = self._open()
        self._handle.write(record(number, kind, reason, raw) + "\n")
        self.count += 1

    def _open(self) -> IO[str]:
        folder = os.path.dirname(os.path.abspath(self.path))
        descriptor, self._temporary = tempfile.mkstemp(
            prefix=".%s." % os.path.basename(self.path), suffix=".part", dir=folder
        )
        return os.fdopen(descriptor, "w", encoding="utf-8", newline="\n")

    def finish(self, keep_empty: bool) -> bool:
        """Move the records into place; True if the file at ``path`` was written."""
        if self._handle is None:
            if not keep_empty:
                return False
            self._handle = self._open()
        self._handle.close()
        self._handle = None
        if self._temporary is not None:
            os.replace(self._temporary, self.path)
            self._temporary = None
        return True

    def discard(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._temporary is not None:
            try:
                os.unlink(self._temporary)
            except OSError:
                pass
            self._temporary = None

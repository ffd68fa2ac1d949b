"""Send the rows of a Spark DataFrame as ASGI messages.

.. code-block:: python

    from asgi_amqp.spark import send_dataframe

    result = send_dataframe(df, url="amqp://user:pw@rabbit:5672/%2F",
                            channel_col="channel", message_col="payload",
                            on_full="retry", capacity=1000)
    print(result.sent, result.channel_full, result.failed)

Every partition opens one layer (one connection) on its executor, sends its
rows and closes it; the counts come back through accumulators. The schema
is checked on the driver before anything is sent.

The executors must be able to import ``asgi_amqp`` (install the package
where they run, or ship it with ``--py-files``), and must reach the broker.
Needs pyspark: ``pip install 'asgi-amqp-layer[spark]'``.
"""

import collections
import functools
import itertools
import logging
import os
from typing import Any, Optional, Sequence, Union

from . import jsonbytes
from .bulk import ON_FULL, BulkSender

try:
    from pyspark.sql import Row
    from pyspark.sql import types as T
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError(
        "asgi_amqp.spark needs pyspark: pip install 'asgi-amqp-layer[spark]'"
    ) from None

__all__ = ["send_dataframe", "SendResult"]

logger = logging.getLogger(__name__)

LOGGED_ERRORS = 10  # per partition


class SendResult(collections.namedtuple("SendResult", "sent channel_full failed")):
    """Counts of rows: sent, refused because their channel was full, failed.

    ``failed`` counts rows that were invalid (null or invalid name, bad JSON,
    a message the layer refuses), rows whose send failed on the broker, and,
    with ``on_full="fail"`` or after repeated connection errors, the rows of
    a partition that were not sent because it stopped.
    """

    @property
    def rows(self):
        return self.sent + self.channel_full + self.failed


# -- schema -------------------------------------------------------------------------

_STRINGS = tuple(
    t
    for t in (T.StringType, getattr(T, "CharType", None), getattr(T, "VarcharType", None))
    if t is not None
)
_SCALARS = _STRINGS + (
    T.BinaryType,
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.NullType,
)


def _unsupported(column, path, data_type):
    where = "column %r" % column + (" (field %s)" % path if path else "")
    return TypeError(
        "%s has type %s, which an ASGI message cannot carry (strings, bytes, numbers, "
        "booleans, arrays, structs and maps with string keys can); cast it first, e.g. "
        "F.col(%r).cast('string')" % (where, data_type.simpleString(), column)
    )


def _check_message_type(column, data_type, path=""):
    if isinstance(data_type, _SCALARS):
        return
    if isinstance(data_type, T.ArrayType):
        _check_message_type(column, data_type.elementType, path + "[]")
        return
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            _check_message_type(
                column, field.dataType, "%s.%s" % (path, field.name) if path else field.name
            )
        return
    if isinstance(data_type, T.MapType):
        if not isinstance(data_type.keyType, _STRINGS):
            raise TypeError(
                "column %r%s is a map with %s keys; ASGI message keys must be "
                "strings"
                % (column, " (field %s)" % path if path else "", data_type.keyType.simpleString())
            )
        _check_message_type(column, data_type.valueType, path + "{}")
        return
    raise _unsupported(column, path, data_type)


def _field(schema, column, role):
    if not isinstance(column, str):
        raise TypeError("%s must be a column name, not %r" % (role, column))
    for field in schema.fields:
        if field.name == column:
            return field
    raise ValueError(
        "%s %r is not a column of the DataFrame; its columns are: %s"
        % (role, column, ", ".join(schema.fieldNames()) or "(none)")
    )


def _plan(schema, channel_col, group_col, message_col, message_cols):
    """Check the schema; (kind, name column, message columns, how to read the message)."""
    if (channel_col is None) == (group_col is None):
        raise ValueError("give exactly one of channel_col and group_col")
    if (message_col is None) == (message_cols is None):
        raise ValueError("give exactly one of message_col and message_cols")
    kind, name_col = ("channel", channel_col) if channel_col is not None else ("group", group_col)
    field = _field(schema, name_col, kind + "_col")
    if not isinstance(field.dataType, _STRINGS):
        raise TypeError(
            "%s_col %r must be a string column, not %s"
            % (kind, name_col, field.dataType.simpleString())
        )
    if message_col is not None:
        field = _field(schema, message_col, "message_col")
        data_type = field.dataType
        if isinstance(data_type, _STRINGS):
            mode = "json"
        elif isinstance(data_type, (T.StructType, T.MapType)):
            _check_message_type(message_col, data_type)
            mode = "object"
        else:
            raise TypeError(
                "message_col %r must be a string (JSON), struct or map column, not %s"
                % (message_col, data_type.simpleString())
            )
        return kind, name_col, [message_col], mode
    if isinstance(message_cols, str) or not message_cols:
        raise ValueError("message_cols must be a non-empty list of column names")
    message_cols = list(message_cols)
    if len(set(message_cols)) != len(message_cols):
        raise ValueError("message_cols names a column twice")
    for column in message_cols:
        _check_message_type(column, _field(schema, column, "message_cols").dataType)
    return kind, name_col, message_cols, "columns"


# -- rows to messages -------------------------------------------------------------------


def _plain(value):
    """A Spark value as plain Python: Rows to dicts, bytearrays to bytes."""
    if isinstance(value, Row):
        return {key: _plain(item) for key, item in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _message(row, columns, mode):
    if mode == "columns":
        return {column: _plain(row[column]) for column in columns}
    value = row[columns[0]]
    if value is None:
        raise ValueError("the message column is null")
    if mode == "json":
        try:
            value = jsonbytes.loads(value)
        except ValueError as exc:
            raise ValueError("invalid JSON: %s" % exc)
        if not isinstance(value, dict):
            raise ValueError("the message JSON is not an object")
        return value
    return _plain(value)


# -- the executor side ---------------------------------------------------------------------


def _log_failure(counter=None):
    """report(where, exc) for a partition's BulkSender: at most LOGGED_ERRORS warnings."""
    counter = counter or itertools.count(1)

    def report(where, exc):
        if next(counter) <= LOGGED_ERRORS:
            logger.warning("asgi_amqp.spark: %s: %s", where, exc)

    return report


def _send_partition(
    rows, kind, name_col, columns, mode, on_full, retries, jobs, layer_config, accumulators
):
    from ..layer import AMQPChannelLayer

    layer = None
    sender = None
    try:
        for row in rows:
            if layer is None:
                layer = AMQPChannelLayer(**layer_config)
                sender = BulkSender(
                    layer, on_full=on_full, retries=retries, jobs=jobs, report=_log_failure()
                )
            name = row[name_col]
            try:
                if not isinstance(name, str):
                    raise ValueError("the %s name is null" % kind)
                if kind == "channel":
                    layer.valid_channel_name(name)
                else:
                    layer.valid_group_name(name)
                message = _message(row, columns, mode)
            except (TypeError, ValueError) as exc:
                sender.invalid("skipped a row", exc)
                continue
            sender.submit(kind, name, message, "send to %s failed" % name)
    finally:
        if sender is not None:
            sender.close()
        if layer is not None:
            layer.close()
        if sender is not None:
            sent, full, failed = accumulators
            sent.add(sender.sent)
            full.add(sender.full)
            failed.add(sender.failed)
            if sender.fatal is not None:
                logger.warning("asgi_amqp.spark: the partition stopped: %s", sender.fatal)


# -- the driver side -----------------------------------------------------------------------


def send_dataframe(
    df: Any,
    url: Union[None, str, Sequence[str]] = None,
    channel_col: Optional[str] = None,
    group_col: Optional[str] = None,
    message_col: Optional[str] = None,
    message_cols: Optional[Sequence[str]] = None,
    on_full: str = "fail",
    retries: int = 5,
    jobs: int = 1,
    **layer_config: Any,
) -> SendResult:
    """Send every row of ``df`` as one ASGI message; returns a :class:`SendResult`.

    :param url: AMQP URL (or list of URLs) the executors connect to; defaults
        to ``$AMQP_URL`` on the driver (executors do not need it set).
    :param channel_col: string column naming each row's channel; or
    :param group_col: string column naming each row's group (``send_group``).
    :param message_col: the message: a string column of JSON objects (bytes
        as ``{"__bytes__": base64}``), or a struct or map column; or
    :param message_cols: list of columns that become the message's keys.
    :param on_full: what a row does when its channel is full: ``"fail"``
        counts it and stops its partition (the partition's remaining rows
        count as failed), ``"skip"`` counts it and goes on, ``"retry"``
        retries with exponential backoff (0.1 s doubling, at most 2 s per
        wait, ``retries`` times), then counts it as channel full.
    :param jobs: deprecated and ignored (it must still be 1-64): each
        partition pipelines its sends, thousands in flight on its one
        connection, in order per channel.
    :param layer_config: further ``AMQPChannelLayer`` options (``prefix``,
        ``expiry``, ``capacity``, ``channel_capacity``, ...): use the same
        ones as the application.

    Raises ValueError or TypeError, before anything is sent, when a column
    is missing or has a type an ASGI message cannot carry.
    """
    if on_full not in ON_FULL:
        raise ValueError("on_full must be one of %s, not %r" % (", ".join(ON_FULL), on_full))
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError("retries must be a non-negative integer")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 64:
        raise ValueError("jobs must be an integer from 1 to 64")
    kind, name_col, columns, mode = _plan(
        df.schema, channel_col, group_col, message_col, message_cols
    )
    from ..layer import DEFAULT_URL

    config = dict(layer_config)
    config["url"] = url or os.environ.get("AMQP_URL") or DEFAULT_URL
    config.setdefault("dead_letter_worker", False)
    _check_layer_config(config)
    try:
        context = df.sparkSession.sparkContext
    except Exception as exc:  # Spark Connect has no SparkContext
        raise TypeError(
            "send_dataframe needs a classic Spark session with a SparkContext "
            "(not Spark Connect): %s" % exc
        )
    accumulators = (context.accumulator(0), context.accumulator(0), context.accumulator(0))
    df.select(*dict.fromkeys([name_col] + columns)).foreachPartition(
        functools.partial(
            _send_partition,
            kind=kind,
            name_col=name_col,
            columns=columns,
            mode=mode,
            on_full=on_full,
            retries=retries,
            jobs=jobs,
            layer_config=config,
            accumulators=accumulators,
        )
    )
    return SendResult(*(a.value for a in accumulators))


def _check_layer_config(config):
    """Fail on the driver, not in every task, for options the layer refuses."""
    from ..layer import AMQPChannelLayer

    AMQPChannelLayer(**config).close()

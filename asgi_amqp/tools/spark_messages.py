"""Which columns of a DataFrame make an ASGI message, and how a row becomes one.

``send_dataframe`` checks the schema on the driver with :func:`plan`, so a
missing column or a type no ASGI message can carry fails before a single
row is sent, not once per row on every executor. The executors then turn
each row into a message with :func:`to_message`, following the plan. Both
halves live here because they must agree on the three ways a message is
read ("json", "object", "columns").

Imported through ``asgi_amqp.tools.spark``, which first says how to install
pyspark when it is missing.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from pyspark.sql import Row
from pyspark.sql import types as T

from . import jsonbytes

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


def _unsupported(column: str, path: str, data_type: T.DataType) -> TypeError:
    where = "column %r" % column + (" (field %s)" % path if path else "")
    return TypeError(
        "%s has type %s, which an ASGI message cannot carry (strings, bytes, numbers, "
        "booleans, arrays, structs and maps with string keys can); cast it first, e.g. "
        "F.col(%r).cast('string')" % (where, data_type.simpleString(), column)
    )


def _check_message_type(column: str, data_type: T.DataType, path: str = "") -> None:
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


def _field(schema: T.StructType, column: object, role: str) -> T.StructField:
    if not isinstance(column, str):
        raise TypeError("%s must be a column name, not %r" % (role, column))
    for field in schema.fields:
        if field.name == column:
            return field
    raise ValueError(
        "%s %r is not a column of the DataFrame; its columns are: %s"
        % (role, column, ", ".join(schema.fieldNames()) or "(none)")
    )


def plan(
    schema: T.StructType,
    channel_col: Optional[str],
    group_col: Optional[str],
    message_col: Optional[str],
    message_cols: Optional[Sequence[str]],
) -> Tuple[str, str, List[str], str]:
    """Check the schema; (kind, name column, message columns, how to read the message)."""
    if (channel_col is None) == (group_col is None):
        raise ValueError("give exactly one of channel_col and group_col")
    if (message_col is None) == (message_cols is None):
        raise ValueError("give exactly one of message_col and message_cols")
    kind, name_col = ("channel", channel_col) if channel_col is not None else ("group", group_col)
    name_field = _field(schema, name_col, kind + "_col")
    if not isinstance(name_field.dataType, _STRINGS):
        raise TypeError(
            "%s_col %r must be a string column, not %s"
            % (kind, name_col, name_field.dataType.simpleString())
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
        return kind, name_field.name, [message_col], mode
    if isinstance(message_cols, str) or not message_cols:
        raise ValueError("message_cols must be a non-empty list of column names")
    message_cols = list(message_cols)
    if len(set(message_cols)) != len(message_cols):
        raise ValueError("message_cols names a column twice")
    for column in message_cols:
        _check_message_type(column, _field(schema, column, "message_cols").dataType)
    return kind, name_field.name, message_cols, "columns"


# -- rows to messages -------------------------------------------------------------------


def _plain(value: Any) -> Any:
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


def to_message(row: Row, columns: Sequence[str], mode: str) -> Dict[str, Any]:
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

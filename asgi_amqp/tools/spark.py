"""Send the rows of a Spark DataFrame as ASGI messages.

.. code-block:: python

    from asgi_amqp.spark import send_dataframe

    result = send_dataframe(df, url="amqp://user:pw@rabbit:5672/%2F",
                            channel_col="channel", message_col="payload",
                            on_full="retry",
                            layer_config=settings.CHANNEL_LAYERS["default"]["CONFIG"])
    print(result.sent, result.channel_full, result.failed)
    for failure in result.failures:  # the first 20 failed rows
        print(failure.channel, failure.reason)

Every partition opens one layer (one connection) on its executor, sends its
rows and closes it; the counts come back through accumulators. The schema
is checked on the driver before anything is sent.

This module is the driver's side: the options, the accumulators and
:class:`SendResult`. The schema check and the row-to-message conversion are
in ``spark_messages``; what runs on each executor is in ``spark_partition``.

The executors must be able to import ``asgi_amqp`` (install the package
where they run, or ship it with ``--py-files``), and must reach the broker.
Needs pyspark: ``pip install 'asgi-amqp-layer[spark]'``.
"""

import collections
import functools
import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import layerconfig
from .bulk import ON_FULL

try:
    from pyspark.accumulators import AccumulatorParam
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError(
        "asgi_amqp.spark needs pyspark: pip install 'asgi-amqp-layer[spark]'"
    ) from None

from .spark_messages import plan
from .spark_partition import SAMPLED_FAILURES, FailureRecord, send_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["send_dataframe", "SendResult", "Failure"]


class Failure(collections.namedtuple("Failure", "channel reason")):
    """A row that was not sent: its channel (the group's name with
    ``group_col``; None when the name is null) and why, in one line."""


class SendResult(collections.namedtuple("SendResult", "sent channel_full failed")):
    """Counts of rows: sent, refused because their channel was full, failed.

    ``failed`` counts rows that were invalid (null or invalid name, bad JSON,
    a message the layer refuses), rows whose send failed on the broker, and,
    with ``on_full="fail"`` or after repeated connection errors, the rows of
    a partition that were not sent because it stopped.

    ``failures`` is a sample: the first 20 failed rows in the DataFrame's
    order (and each partition's stop), as :class:`Failure`. It is not part
    of the tuple, so ``result == (sent, channel_full, failed)`` still holds.
    """

    failures: List[Failure]

    def __new__(
        cls,
        sent: int,
        channel_full: int,
        failed: int,
        failures: Iterable[Sequence[Any]] = (),
    ) -> "SendResult":
        result = super(SendResult, cls).__new__(cls, sent, channel_full, failed)
        result.failures = [Failure(*failure) for failure in failures]
        return result

    @property
    def rows(self) -> int:
        return self.sent + self.channel_full + self.failed


class _FirstFailures(AccumulatorParam[List[FailureRecord]]):
    """Accumulates (partition, row, channel, reason), keeping the first
    SAMPLED_FAILURES in the DataFrame's order."""

    def zero(self, value: List[FailureRecord]) -> List[FailureRecord]:
        return []

    def addInPlace(
        self, value1: List[FailureRecord], value2: List[FailureRecord]
    ) -> List[FailureRecord]:
        return sorted(value1 + value2, key=lambda failure: failure[:2])[:SAMPLED_FAILURES]


def send_dataframe(
    df: "DataFrame",
    url: Union[None, str, Sequence[str]] = None,
    channel_col: Optional[str] = None,
    group_col: Optional[str] = None,
    message_col: Optional[str] = None,
    message_cols: Optional[Sequence[str]] = None,
    on_full: str = "fail",
    retries: int = 5,
    jobs: int = 1,
    layer_config: Optional[Mapping[str, Any]] = None,
    **options: Any,
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
    :param layer_config: the application's layer options, e.g.
        ``settings.CHANNEL_LAYERS["default"]["CONFIG"]`` (or
        ``asgi_amqp.tools.layerconfig.from_file(path)``): every
        ``AMQPChannelLayer`` option, so the queues a send creates get the
        application's arguments.
    :param options: further ``AMQPChannelLayer`` options (``prefix``,
        ``expiry``, ``group_expiry``, ``capacity``, ``channel_capacity``,
        ``queue_type``, ``symmetric_encryption_keys``, ...); they override
        ``layer_config``.

    A channel whose queue exists already is sent to as it is, never
    declared again, and counts as full at the queue's own capacity (read on
    the driver through the management API when it answers).

    Raises ValueError or TypeError, before anything is sent, when a column
    is missing or has a type an ASGI message cannot carry, or an option is
    unknown.
    """
    if on_full not in ON_FULL:
        raise ValueError("on_full must be one of %s, not %r" % (", ".join(ON_FULL), on_full))
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError("retries must be a non-negative integer")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 64:
        raise ValueError("jobs must be an integer from 1 to 64")
    kind, name_col, columns, mode = plan(
        df.schema, channel_col, group_col, message_col, message_cols
    )
    from ..layer import DEFAULT_URL

    config = layerconfig.with_url(
        layerconfig.merge(
            [
                layerconfig.checked(layer_config or {}, "layer_config"),
                layerconfig.checked(options, "send_dataframe's options"),
                {"url": url} if url else {},
            ]
        )
    )
    config["url"] = config.get("url") or os.environ.get("AMQP_URL") or DEFAULT_URL
    config.setdefault("dead_letter_worker", False)
    _check_layer_config(config)
    urls = [config["url"]] if isinstance(config["url"], str) else list(config["url"])
    config = layerconfig.with_existing_capacities(config, urls)
    try:
        context = df.sparkSession.sparkContext
    except Exception as exc:  # Spark Connect has no SparkContext
        raise TypeError(
            "send_dataframe needs a classic Spark session with a SparkContext "
            "(not Spark Connect): %s" % exc
        )
    accumulators = (
        context.accumulator(0),
        context.accumulator(0),
        context.accumulator(0),
        context.accumulator([], _FirstFailures()),
    )
    df.select(*dict.fromkeys([name_col] + columns)).foreachPartition(
        functools.partial(
            send_partition,
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
    sent, full, failed, failures = accumulators
    return SendResult(
        sent.value, full.value, failed.value, [failure[2:] for failure in failures.value]
    )


def _check_layer_config(config: Dict[str, Any]) -> None:
    """Fail on the driver, not in every task, for options the layer refuses."""
    from ..layer import AMQPChannelLayer

    AMQPChannelLayer(**config).close()

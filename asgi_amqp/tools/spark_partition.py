"""What each Spark partition runs on its executor: send its rows, count them.

``send_dataframe`` hands :func:`send_partition` to ``foreachPartition``.
PySpark pickles it, with its arguments, to the executors, which import this
module to find it again: so it stays a module-level function whose
arguments are plain data and Spark accumulators, never a closure over the
driver's objects. Each partition opens one layer (one connection) on the
first row, sends through a :class:`~asgi_amqp.tools.bulk.BulkSender`, and
adds its counts and its first failures to the driver's accumulators.
"""

import itertools
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from .bulk import BulkSender
from .spark_messages import to_message

if TYPE_CHECKING:
    from pyspark.accumulators import Accumulator
    from pyspark.sql import Row


# The name the Spark sender's warnings have always had, so that a logging
# configuration written for them still applies.
logger = logging.getLogger("asgi_amqp.tools.spark")

LOGGED_ERRORS = 10  # per partition
SAMPLED_FAILURES = 20  # in SendResult.failures

# A failed row: (partition, row number, its channel or group name, the reason).
FailureRecord = Tuple[int, int, Optional[str], str]
# The driver's accumulators: rows sent, channel full, failed, and the first failures.
Accumulators = Tuple[
    "Accumulator[int]",
    "Accumulator[int]",
    "Accumulator[int]",
    "Accumulator[List[FailureRecord]]",
]


class _Row(object):
    """Where a row is, for the BulkSender's reports: printed as "row N of partition P"."""

    __slots__ = ("partition", "number", "name")

    def __init__(self, partition: int, number: int, name: Optional[str]) -> None:
        self.partition = partition
        self.number = number
        self.name = name

    def __str__(self) -> str:
        return "row %d of partition %d" % (self.number, self.partition)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _log_failure(
    sample: List[FailureRecord], counter: Optional[Iterator[int]] = None
) -> Callable[[_Row, BaseException], None]:
    """report(where, exc) for a partition's BulkSender: at most LOGGED_ERRORS
    warnings, and the first SAMPLED_FAILURES rows kept in ``sample``."""
    numbers = counter or itertools.count(1)

    def report(where: _Row, exc: BaseException) -> None:
        count = next(numbers)
        if count <= LOGGED_ERRORS:
            logger.warning("asgi_amqp.spark: %s (%s): %s", where, where.name, exc)
        if count <= SAMPLED_FAILURES:
            sample.append((where.partition, where.number, where.name, _one_line(exc)))

    return report


def _partition_index() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def send_partition(
    rows: Iterable["Row"],
    kind: str,
    name_col: str,
    columns: List[str],
    mode: str,
    on_full: str,
    retries: int,
    jobs: int,
    layer_config: Dict[str, Any],
    accumulators: Accumulators,
) -> None:
    """Send one partition's ``rows``; the other arguments are ``send_dataframe``'s,
    already checked on the driver (``kind, name_col, columns, mode`` from
    :func:`~asgi_amqp.tools.spark_messages.plan`).

    The layer is opened on the first row, so an empty partition never
    connects. A row that is not a valid message is counted as failed and the
    partition goes on. The counts, and the reason a partition stopped (a
    full channel with ``on_full="fail"``, or the broker), reach
    ``accumulators`` however the partition ends.
    """
    from ..layer import AMQPChannelLayer

    layer: Optional[AMQPChannelLayer] = None
    sender: Optional[BulkSender] = None
    sample: List[FailureRecord] = []
    partition = _partition_index()
    try:
        for number, row in enumerate(rows, 1):
            if sender is None:
                layer = AMQPChannelLayer(**layer_config)
                sender = BulkSender(
                    layer,
                    on_full=on_full,
                    retries=retries,
                    jobs=jobs,
                    report=_log_failure(sample),
                    keep_existing=True,
                )
            name = row[name_col]
            where = _Row(partition, number, name)
            try:
                if not isinstance(name, str):
                    raise ValueError("the %s name is null" % kind)
                if kind == "channel":
                    sender.layer.valid_channel_name(name)
                else:
                    sender.layer.valid_group_name(name)
                message = to_message(row, columns, mode)
            except (TypeError, ValueError) as exc:
                sender.invalid(where, exc)
                continue
            sender.submit(kind, name, message, where)
    finally:
        if sender is not None:
            sender.close()
        if layer is not None:
            layer.close()
        if sender is not None:
            _account(sender, sample, partition, accumulators)


def _account(
    sender: BulkSender, sample: List[FailureRecord], partition: int, accumulators: Accumulators
) -> None:
    """Add a partition's counts and failures to the driver's accumulators."""
    sent, full, failed, failures = accumulators
    sent.add(sender.sent)
    full.add(sender.full)
    # Spark's "failed": every row neither sent nor refused as full (rows after a stop too).
    failed.add(sender.processed - sender.sent - sender.full)
    if sender.stopped_at is not None:  # on_full="fail"
        row = sender.stopped_at
        reason = "channel %s is full (on_full=fail): the partition stopped" % row.name
        sample.append((partition, row.number, row.name, reason))
    if sender.fatal is not None:
        logger.warning("asgi_amqp.spark: the partition stopped: %s", sender.fatal)
        reason = "the partition stopped: %s" % _one_line(sender.fatal)
        sample.append((partition, _LAST, None, reason))
    failures.add(sample)


_LAST = 1 << 62  # sorts after every row of its partition

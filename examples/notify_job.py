"""Send a file of notifications (Parquet or CSV) as ASGI messages, with Spark.

Each row becomes one message, sent to the channel (or group) named in a
column. The message is either one column holding a JSON object (or a
struct/map column), or several columns that become the message's keys.

Locally::

    AMQP_URL=amqp://user:pw@localhost:5672/%2F \\
    spark-submit --master 'local[2]' examples/notify_job.py notifications.parquet \\
        --channel-col channel --message-col payload

    # or without spark-submit (Spark runs in-process, local[*]), with the
    # application's own layer settings:
    python examples/notify_job.py notifications.csv --group-col room \\
        --message-cols title,body --on-full skip --django-settings mysite.settings

Spark logs at WARN. The first failed rows are listed (channel and reason),
and the last line on stderr is the summary: sent, channel full, failed, rows/s.
Exit status: 0 every row sent, 1 some rows hit a full channel or failed,
2 bad arguments, input or schema, or the broker cannot be reached.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Send the rows of a Parquet or CSV file as ASGI messages via asgi_amqp.",
        epilog="Exit status: 0 all sent, 1 some rows channel full or failed, "
        "2 usage, input or connection error.",
    )
    parser.add_argument(
        "input", help="Parquet or CSV file or directory (local, hdfs://, s3a://...)"
    )
    parser.add_argument(
        "--format",
        choices=["auto", "parquet", "csv"],
        default="auto",
        help="input format; auto: by extension, Parquet otherwise",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("AMQP_URL"),
        help="AMQP URL (default: $AMQP_URL; prefer the variable for passwords)",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--channel-col", help="column with each row's channel (default: channel)")
    target.add_argument("--group-col", help="column with each row's group")
    message = parser.add_mutually_exclusive_group()
    message.add_argument(
        "--message-col", help="column with the message: JSON text, struct or map (default: message)"
    )
    message.add_argument(
        "--message-cols", help="comma-separated columns that become the message's keys"
    )
    parser.add_argument(
        "--django-settings",
        default=os.environ.get("DJANGO_SETTINGS_MODULE"),
        help="read the layer options from CHANNEL_LAYERS of this Django settings module "
        "(default: $DJANGO_SETTINGS_MODULE)",
    )
    parser.add_argument("--layer", default="default", help="the CHANNEL_LAYERS entry")
    parser.add_argument("--config", help="a JSON or TOML file of layer options")
    parser.add_argument("--prefix", help="the layer's prefix (default: asgi)")
    parser.add_argument("--capacity", type=int, help="the application's capacity setting")
    parser.add_argument("--expiry", type=float, help="the application's expiry setting (s)")
    parser.add_argument("--group-expiry", type=float, help="the application's group_expiry (s)")
    parser.add_argument("--queue-type", choices=["classic", "quorum"])
    parser.add_argument(
        "--on-full",
        choices=["fail", "skip", "retry"],
        default="fail",
        help="when a channel is full (default: fail, as asgi-amqp send)",
    )
    parser.add_argument("--retries", type=int, default=5, help="retries with --on-full retry")
    parser.add_argument(
        "--partitions", type=int, help="repartition the input to this many partitions (connections)"
    )
    parser.add_argument("--master", help="Spark master when not set by spark-submit")
    args = parser.parse_args(argv)
    if not args.group_col and not args.channel_col:
        args.channel_col = "channel"
    if not args.message_cols and not args.message_col:
        args.message_col = "message"
    return args


def read(spark, path, fmt):
    if fmt == "auto":
        fmt = "csv" if path.rstrip("/").lower().endswith((".csv", ".csv.gz")) else "parquet"
    if fmt == "csv":
        return spark.read.option("header", True).option("escape", '"').csv(path)
    return spark.read.parquet(path)


def main(argv=None, spark=None):
    args = parse_args(argv)
    try:
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession

        from asgi_amqp.spark import send_dataframe
    except ImportError as exc:
        print("notify_job: %s" % exc, file=sys.stderr)
        return 2
    from asgi_amqp.tools import layerconfig
    from asgi_amqp.urls import redact

    try:
        config = layerconfig.layer_config(
            args.django_settings, args.layer, args.config, _options(args)
        )
    except layerconfig.ConfigError as exc:
        print("notify_job: %s" % exc, file=sys.stderr)
        return 2
    own_session = spark is None
    if own_session:
        builder = SparkSession.builder.appName("asgi-amqp notify_job").config(
            "spark.log.level", "WARN"
        )
        if args.master:
            builder = builder.master(args.master)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    summary = None
    try:
        try:
            df = read(spark, args.input, args.format)
        except PySparkException as exc:
            print(
                "notify_job: cannot read %s: %s" % (args.input, str(exc).splitlines()[0]),
                file=sys.stderr,
            )
            return 2
        if args.partitions:
            df = df.repartition(args.partitions)
        started = time.monotonic()
        try:
            result = send_dataframe(
                df,
                url=args.url,
                channel_col=args.channel_col,
                group_col=args.group_col,
                message_col=args.message_col,
                message_cols=args.message_cols.split(",") if args.message_cols else None,
                on_full=args.on_full,
                retries=args.retries,
                layer_config=config,
            )
        except (TypeError, ValueError) as exc:
            print("notify_job: %s" % exc, file=sys.stderr)
            return 2
        elapsed = time.monotonic() - started
        print(
            "notify_job: %s -> %s prefix %r"
            % (args.input, redact(args.url or "(default)"), config.get("prefix", "asgi")),
            file=sys.stderr,
        )
        for failure in result.failures:
            print("notify_job: failed: %s: %s" % (failure.channel, failure.reason), file=sys.stderr)
        rate = result.sent / elapsed if elapsed else 0.0
        summary = "sent %d, channel full %d, failed %d in %.2f s (%s rows/s)" % (
            result.sent,
            result.channel_full,
            result.failed,
            elapsed,
            ("%.1f" if rate < 10 else "%.0f") % rate,  # a few rows: not "(0 rows/s)"
        )
        if result.rows and result.failed == result.rows:
            return 2  # nothing got through: most likely the broker is unreachable
        return 0 if result.channel_full == 0 and result.failed == 0 else 1
    finally:
        if own_session:
            spark.stop()
        if summary is not None:  # the last line, after Spark's own
            print(summary, file=sys.stderr)


def _options(args):
    """The layer options given on the command line."""
    given = {
        "prefix": args.prefix,
        "capacity": args.capacity,
        "expiry": args.expiry,
        "group_expiry": args.group_expiry,
        "queue_type": args.queue_type,
    }
    return {key: value for key, value in given.items() if value is not None}


if __name__ == "__main__":
    sys.exit(main())

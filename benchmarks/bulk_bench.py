"""Bulk sending: the same rows through the command line's bulk mode and through
the PySpark sender (``asgi_amqp.spark.send_dataframe``), in one run.

    python benchmarks/bulk_bench.py [--rows 100000] [--partitions 2] [--rounds 1]

Needs AMQP_URL (and AMQP_MANAGEMENT_URL for the clean-up), pyspark and Java.
Each round sends every row once per contestant, alternating which goes first,
drains nothing in between but deletes the queues, and checks the queues hold
exactly the rows sent. Prints rows/s and the ratio; writes
benchmarks/results/bulk.md and bulk.json.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
CHANNELS = 100


def rows(count):
    for i in range(count):
        yield "bulk.%d" % (i % CHANNELS), {"n": i, "text": "notification %d" % i, "pad": "x" * 120}


def make_layer(prefix, capacity):
    from asgi_amqp import AMQPChannelLayer

    return AMQPChannelLayer(prefix=prefix, capacity=capacity, expiry=600,
                            dead_letter_worker=False)


def queued(layer):
    from asgi_amqp import admin

    total = 0
    for i in range(CHANNELS):
        queue = layer.topology.channel_queue("bulk.%d" % i)
        frame = layer._admin([admin.queue_declare(queue, layer.topology.channel_queue_arguments(
            "bulk.%d" % i))], "count")
        total += frame.message_count
    return total


def run_cli(path, prefix, capacity):
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "asgi_amqp", "--prefix", prefix, "--capacity", str(capacity),
         "--expiry", "600", "send", "--from", path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit("CLI bulk send failed (%d): %s" % (result.returncode, result.stderr[-500:]))
    return elapsed, result.stderr.strip().splitlines()[-1]


def run_spark(spark, df, prefix, capacity):
    from asgi_amqp.spark import send_dataframe

    started = time.perf_counter()
    result = send_dataframe(df, channel_col="channel", message_col="message", prefix=prefix,
                            capacity=capacity, expiry=600)
    elapsed = time.perf_counter() - started
    return elapsed, result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if not os.environ.get("AMQP_URL"):
        raise SystemExit("set AMQP_URL")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    capacity = args.rows // CHANNELS + 10
    spark = (SparkSession.builder.master("local[%d]" % args.partitions)
             .appName("asgi_amqp bulk bench").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    data = [(channel, json.dumps(message)) for channel, message in rows(args.rows)]
    df = spark.createDataFrame(data, ["channel", "message"]).repartition(args.partitions).cache()
    df.count()
    handle, path = tempfile.mkstemp(suffix=".jsonl")
    with os.fdopen(handle, "w") as out:
        for channel, message in rows(args.rows):
            out.write(json.dumps({"channel": channel, "message": message}) + "\n")
    figures = {"cli": [], "spark": []}
    summaries = {}
    try:
        for round_number in range(args.rounds):
            order = ["cli", "spark"] if round_number % 2 == 0 else ["spark", "cli"]
            for contestant in order:
                prefix = "bulk-%s" % uuid.uuid4().hex[:8]
                layer = make_layer(prefix, capacity)
                try:
                    if contestant == "cli":
                        elapsed, summary = run_cli(path, prefix, capacity)
                    else:
                        elapsed, summary = run_spark(spark, df, prefix, capacity)
                    held = queued(layer)
                    if held != args.rows:
                        raise SystemExit("%s: %d rows sent but %d queued" % (contestant, args.rows, held))
                    figures[contestant].append(args.rows / elapsed)
                    summaries[contestant] = str(summary)
                    print("round %d %-5s %8.0f rows/s  (%s)" % (round_number + 1, contestant,
                                                              args.rows / elapsed, summary))
                finally:
                    layer.flush()
                    _delete_shared(layer)
                    layer.close()
    finally:
        os.unlink(path)
        spark.stop()
    best = {name: sorted(values)[len(values) // 2] for name, values in figures.items()}
    ratio = best["spark"] / best["cli"]
    table = ("| sender | rows/s (median of %d) |\n|---|---:|\n| CLI bulk mode (`send --from`) | %.0f |\n"
             "| PySpark `send_dataframe`, %d partitions | %.0f |\n| Spark / CLI | %.2fx |\n"
             % (args.rounds, best["cli"], args.partitions, best["spark"], ratio))
    print("\n" + table)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "bulk.md"), "w") as out:
        out.write("# Bulk sends: %d rows, %d channels\n\n`python benchmarks/bulk_bench.py`, %s, %s, "
                  "Python %s, %d cores.\n\n%s\nLast summaries: %s\n"
                  % (args.rows, CHANNELS, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     platform.platform(), platform.python_version(), os.cpu_count(), table,
                     json.dumps(summaries)))
    with open(os.path.join(RESULTS, "bulk.json"), "w") as out:
        json.dump({"rows": args.rows, "partitions": args.partitions, "rows_per_second": best,
                   "rounds": figures, "spark_over_cli": ratio}, out, indent=2)


def _delete_shared(layer):
    """flush() keeps the prefix's shared objects; a throw-away prefix removes them too."""
    from asgi_amqp import admin

    topology = layer.topology
    layer._admin([admin.queue_delete(topology.dead_letter_queue),
                  admin.exchange_delete(topology.dead_letter_exchange),
                  admin.exchange_delete(topology.group_router)], "delete shared objects")


if __name__ == "__main__":
    main()

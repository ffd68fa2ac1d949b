"""Aggregate a benchmark run's raw samples with PySpark and write the report.

    python benchmarks/report_spark.py                       # the latest run in results/raw
    python benchmarks/report_spark.py --run benchmarks/results/raw/run-<stamp>.json
    python benchmarks/report_spark.py --master spark://host:7077
    python benchmarks/report_spark.py --engine python       # same figures, no Spark
    python benchmarks/report_spark.py --check               # Spark and Python must agree

Reads the raw files next to ``run-<stamp>.json`` (``report.write_raw``)
and writes what benchmarks/README.md's Output lists into ``--results``
(``benchmarks/results``), with the same figures as ``report.aggregate_python``.

Spark runs in local mode (``local[2]``) by default, with the UI off and the
executors on this Python. With ``--master`` pointing at a cluster, the raw
files must be readable at the same path on the executors (a shared
filesystem), or pass ``--raw-uri`` with their common location (hdfs://, s3a://).
"""

import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import report  # noqa: E402
from benchmarks.harness import Recorder  # noqa: E402


def latest_run(raw_dir):
    runs = sorted(glob.glob(os.path.join(raw_dir, "run-*.json")))
    return runs[-1] if runs else None


def spark_session(master, app="asgi_amqp-bench-report"):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import warnings

    warnings.filterwarnings("ignore", message=".*pandas.*", category=FutureWarning)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _reader(spark, path, ddl):
    if path.endswith(".parquet"):
        return spark.read.parquet(path)
    return spark.read.schema(ddl).json(path)  # JSON lines: no guessing of all-null columns


def aggregate_spark(spark, run, raw_uri=None):
    """``{scenario: {contestant: stats}}``, the same shape as ``report.aggregate_python``."""
    from pyspark.sql import functions as F

    base = raw_uri.rstrip("/") if raw_uri else "file://" + run["_dir"]
    samples = _reader(spark, "%s/%s" % (base, run["samples_file"]), Recorder.SAMPLES_DDL)
    rounds = _reader(spark, "%s/%s" % (base, run["rounds_file"]), Recorder.ROUNDS_DDL)
    keys = ["scenario", "contestant"]

    ok_dur = F.when(F.col("ok"), F.col("dur_ns"))
    fractions = ", ".join(str(f) for f in report.PERCENTILES)
    latency = samples.groupBy(*keys).agg(
        F.count(ok_dur).alias("samples"),
        F.sum(F.when(~F.col("ok"), 1).otherwise(0)).alias("misses"),
        F.expr("percentile(CASE WHEN ok THEN dur_ns END, array(%s))" % fractions).alias("pct"),
        F.expr(
            "percentile(CASE WHEN ok AND value IS NOT NULL THEN dur_ns - value * 1e6 END, "
            "array(%s))" % ", ".join(str(f) for f in report.AFTER_SEND_PERCENTILES)
        ).alias("after"),
        F.max(ok_dur).alias("max_ns"),
        F.avg(ok_dur).alias("mean_ns"),
    )

    per_round = rounds.withColumn(
        "rate", F.when(F.col("wall_s") > 0, F.col("units") / F.col("wall_s")).otherwise(0.0)
    ).withColumn("dps", F.when(F.col("wall_s") > 0, F.col("delivered") / F.col("wall_s")))
    rates = per_round.groupBy(*keys).agg(
        F.count("*").alias("rounds"),
        F.first("ops").alias("ops_per_round"),
        F.sort_array(F.collect_list(F.struct("round", "rate"))).alias("by_round"),
        F.expr("percentile(rate, 0.5)").alias("rate_median"),
        F.min("rate").alias("rate_min"),
        F.max("rate").alias("rate_max"),
        F.expr("percentile(dps, 0.5)").alias("deliveries_median"),
        F.sum("error_count").alias("errors"),
        F.sum("problem_count").alias("problems"),
    )

    stats = {}
    for row in rates.join(latency, keys, "left").collect():
        pct = row["pct"] or [None] * len(report.PERCENTILES)
        entry = {
            "rounds": row["rounds"],
            "ops_per_round": row["ops_per_round"],
            "rates": [round(r["rate"], 1) for r in row["by_round"]],
            "rate_median": row["rate_median"],
            "rate_min": row["rate_min"],
            "rate_max": row["rate_max"],
            "deliveries_median": row["deliveries_median"],
            "samples": row["samples"] or 0,
            "misses": row["misses"] or 0,
            "errors": row["errors"] or 0,
            "problems": row["problems"] or 0,
            "mean_ms": report._ms(row["mean_ns"]),
            "max_ms": report._ms(row["max_ns"]),
        }
        for fraction, value in zip(report.PERCENTILES, pct):
            entry["p%d_ms" % round(fraction * 100)] = report._ms(value)
        after = row["after"] or [None] * len(report.AFTER_SEND_PERCENTILES)
        for fraction, value in zip(report.AFTER_SEND_PERCENTILES, after):
            entry["after_send_p%d_ms" % round(fraction * 100)] = report._ms(value)
        stats.setdefault(row["scenario"], {})[row["contestant"]] = entry
    return report.finish_stats(stats, run)


def compare(a, b, tolerance=1e-6):
    """Differences between two aggregations (for --check)."""
    problems = []
    for scenario in sorted(set(a) | set(b)):
        for contestant in sorted(set(a.get(scenario, {})) | set(b.get(scenario, {}))):
            x = a.get(scenario, {}).get(contestant)
            y = b.get(scenario, {}).get(contestant)
            if x is None or y is None:
                problems.append("%s/%s only in one" % (scenario, contestant))
                continue
            for key in sorted(set(x) | set(y)):
                u, v = x.get(key), y.get(key)
                if isinstance(u, float) or isinstance(v, float):
                    if u is None or v is None or abs(u - v) > tolerance * max(1.0, abs(u)):
                        problems.append("%s/%s %s: %r != %r" % (scenario, contestant, key, u, v))
                elif isinstance(u, list) and u and isinstance(u[0], float):
                    if len(u) != len(v) or any(abs(p - q) > 0.11 for p, q in zip(u, v)):
                        problems.append("%s/%s %s differ" % (scenario, contestant, key))
                elif u != v:
                    problems.append("%s/%s %s: %r != %r" % (scenario, contestant, key, u, v))
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="run-<stamp>.json (default: the latest in results/raw)")
    parser.add_argument(
        "--results",
        default=os.path.join(HERE, "results"),
        help="where summary.md/json go (benchmarks/results)",
    )
    parser.add_argument(
        "--master",
        default=os.environ.get("SPARK_MASTER", "local[2]"),
        help="Spark master URL (local[2]; or $SPARK_MASTER)",
    )
    parser.add_argument(
        "--raw-uri",
        help="where executors read the raw files (default: file:// + the run's directory)",
    )
    parser.add_argument(
        "--engine",
        choices=("spark", "python"),
        default="spark",
        help="aggregate with PySpark (default) or plain Python",
    )
    parser.add_argument(
        "--check", action="store_true", help="aggregate with both and fail if they disagree"
    )
    args = parser.parse_args(argv)

    run_path = args.run or latest_run(os.path.join(args.results, "raw"))
    if not run_path or not os.path.exists(run_path):
        sys.exit("no run found (run python -m benchmarks --only layer first, or pass --run)")
    run = report.load_run(run_path)

    stats = engine = None
    if args.engine == "spark" or args.check:
        try:
            spark = spark_session(args.master)
        except Exception as exc:
            if args.check:
                raise
            print(
                "PySpark unavailable (%s: %s); aggregating in Python" % (type(exc).__name__, exc),
                file=sys.stderr,
            )
        else:
            try:
                stats = aggregate_spark(spark, run, args.raw_uri)
                engine = "PySpark %s (%s)" % (spark.version, args.master)
            finally:
                spark.stop()
    if stats is None or args.check:
        python_stats = report.aggregate_python(
            report.read_rows(run, "samples"), report.read_rows(run, "rounds"), run
        )
        if args.check:
            problems = compare(stats, python_stats)
            if problems:
                print(
                    "Spark and Python aggregations differ:\n  " + "\n  ".join(problems[:30]),
                    file=sys.stderr,
                )
                return 1
            print(
                "check: Spark and Python aggregations agree "
                "(%d scenario/contestant cells)" % sum(len(v) for v in stats.values())
            )
        if stats is None:
            stats, engine = python_stats, "Python (report.aggregate_python)"

    targets, paths = report.write_outputs(stats, run, args.results, engine)
    report.print_report(stats, run, targets)
    print(
        "\naggregated by %s; wrote %s"
        % (engine, ", ".join(os.path.relpath(p, ROOT) for p in paths))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

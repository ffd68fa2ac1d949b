"""asgi_amqp.spark.send_dataframe and examples/notify_job.py, on Spark local[2].

One Spark session for the module (it takes seconds to start). The executors
are Python workers of this interpreter (PYSPARK_PYTHON) and find asgi_amqp
through PYTHONPATH (set here, for a checkout that is not installed).

pyspark is imported by the tests that run, not when the module is collected:
``make check`` installs no Spark and runs only the one broker-free test here.
"""

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from helpers import Management, drain, wait_until

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import notify_job  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    path = os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH", "")] if p)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP", "PYTHONPATH")}
    os.environ.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=path)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("asgi_amqp tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYTHONPATH", path)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def prefix():
    return "sp-%s" % uuid.uuid4().hex[:10]


@pytest.fixture
def layer(broker, prefix, new_layer):
    return new_layer(broker, flush=True, prefix=prefix, capacity=5000)


def send_dataframe(df, **kwargs):
    """``asgi_amqp.spark.send_dataframe``, imported when a test calls it (it needs pyspark)."""
    from asgi_amqp.spark import send_dataframe as send

    return send(df, **kwargs)


def _send(broker, prefix, df, capacity=5000, **kwargs):
    kwargs.setdefault("management_url", broker.management_url)
    return send_dataframe(df, url=broker.amqp_url, prefix=prefix, capacity=capacity, **kwargs)


def _numbered(spark, rows, channels=4, partitions=2):
    from pyspark.sql import functions as F

    return (
        spark.range(rows)
        .select(
            F.concat(F.lit("sp.c"), (F.col("id") % channels).cast("string")).alias("ch"),
            F.to_json(F.struct(F.col("id"), F.lit("hello").alias("text"))).alias("json"),
            F.col("id"),
        )
        .repartition(partitions)
    )


# -- sending ---------------------------------------------------------------------------------------


def test_every_row_arrives_exactly_once(spark, broker, prefix, layer):
    from asgi_amqp.spark import SendResult

    rows = 1000
    df = _numbered(spark, rows)
    assert df.rdd.getNumPartitions() == 2
    result = _send(broker, prefix, df, channel_col="ch", message_col="json")
    assert result == SendResult(rows, 0, 0)
    assert result.rows == rows
    got = drain(layer, ["sp.c0", "sp.c1", "sp.c2", "sp.c3"])
    ids = sorted(m["id"] for _, m in got)
    assert ids == list(range(rows))
    assert all(channel == "sp.c%d" % (m["id"] % 4) and m["text"] == "hello" for channel, m in got)


def test_jobs_per_partition(spark, broker, prefix, layer):
    df = _numbered(spark, 600)
    assert _send(broker, prefix, df, channel_col="ch", message_col="json", jobs=4) == (600, 0, 0)
    ids = sorted(m["id"] for _, m in drain(layer, ["sp.c0", "sp.c1", "sp.c2", "sp.c3"]))
    assert ids == list(range(600))


def test_struct_message_column_with_bytes_and_nesting(spark, broker, prefix, layer):
    from pyspark.sql import Row

    df = spark.createDataFrame(
        [
            Row(
                ch="sp.s",
                msg=Row(
                    text="a",
                    raw=bytearray(b"\x00\x01"),
                    tags=["x", "y"],
                    inner=Row(n=1, f=0.5, ok=True),
                ),
            ),
            Row(ch="sp.s", msg=Row(text="b", raw=None, tags=[], inner=Row(n=2, f=1.5, ok=False))),
        ]
    )
    assert _send(broker, prefix, df, channel_col="ch", message_col="msg") == (2, 0, 0)
    got = sorted((m for _, m in drain(layer, ["sp.s"])), key=lambda m: m["text"])
    assert got == [
        {
            "text": "a",
            "raw": b"\x00\x01",
            "tags": ["x", "y"],
            "inner": {"n": 1, "f": 0.5, "ok": True},
        },
        {"text": "b", "raw": None, "tags": [], "inner": {"n": 2, "f": 1.5, "ok": False}},
    ]


def test_message_cols_with_map_and_array(spark, broker, prefix, layer):
    df = spark.createDataFrame(
        [("sp.m", "hi", {"k": 1}, [1, 2]), ("sp.m", "yo", {}, None)],
        "ch string, title string, attrs map<string,int>, nums array<int>",
    )
    result = _send(broker, prefix, df, channel_col="ch", message_cols=["title", "attrs", "nums"])
    assert result == (2, 0, 0)
    got = sorted((m for _, m in drain(layer, ["sp.m"])), key=lambda m: m["title"])
    assert got == [
        {"title": "hi", "attrs": {"k": 1}, "nums": [1, 2]},
        {"title": "yo", "attrs": {}, "nums": None},
    ]


def test_json_bytes_convention(spark, broker, prefix, layer):
    df = spark.createDataFrame(
        [("sp.j", json.dumps({"raw": {"__bytes__": "AAE="}}))], "ch string, m string"
    )
    assert _send(broker, prefix, df, channel_col="ch", message_col="m") == (1, 0, 0)
    assert drain(layer, ["sp.j"]) == [("sp.j", {"raw": b"\x00\x01"})]


def test_group_col_sends_to_groups(spark, broker, prefix, layer):
    layer.group_add("sp.room", "sp.alice")
    layer.group_add("sp.room", "sp.bob")
    df = spark.createDataFrame(
        [("sp.room", '{"n": %d}' % i) for i in range(10)], "g string, m string"
    )
    assert _send(broker, prefix, df, group_col="g", message_col="m") == (10, 0, 0)
    for member in ("sp.alice", "sp.bob"):
        assert sorted(m["n"] for _, m in drain(layer, [member])) == list(range(10))


def test_invalid_rows_are_counted_as_failed_and_the_rest_sent(spark, broker, prefix, layer):
    df = spark.createDataFrame(
        [
            ("sp.ok", '{"i": 1}'),
            (None, '{"i": 2}'),
            ("bad name", '{"i": 3}'),
            ("sp.ok", "{not json"),
            ("sp.ok", "[1, 2]"),
            ("sp.ok", None),
            ("sp.ok", '{"big": 99999999999999999999999}'),
            ("sp.ok", '{"i": 4}'),
        ],
        "ch string, m string",
    ).repartition(2)
    assert _send(broker, prefix, df, channel_col="ch", message_col="m") == (2, 0, 6)
    assert sorted(m["i"] for _, m in drain(layer, ["sp.ok"])) == [1, 4]


# -- full channels ---------------------------------------------------------------------------------


def _one_channel(spark, rows):
    df = spark.createDataFrame(
        [("sp.full", '{"i": %d}' % i) for i in range(rows)], "ch string, m string"
    )
    return df.repartition(2)


def test_on_full_skip_counts_every_refused_row(spark, broker, prefix, new_layer):
    result = _send(
        broker,
        prefix,
        _one_channel(spark, 40),
        capacity=10,
        channel_col="ch",
        message_col="m",
        on_full="skip",
    )
    assert result == (10, 30, 0)
    small = new_layer(broker, flush=True, prefix=prefix, capacity=10)
    assert len(drain(small, ["sp.full"])) == 10


def test_on_full_fail_stops_each_partition(spark, broker, prefix, new_layer):
    df = _one_channel(spark, 40)
    sizes = df.rdd.glom().map(len).collect()
    assert len(sizes) == 2 and min(sizes) > 10
    result = _send(
        broker, prefix, df, capacity=10, channel_col="ch", message_col="m", on_full="fail"
    )
    # Sends are pipelined: a partition stops reading rows at its first full
    # channel, and the rows already in flight count as they turn out (full).
    sent, full, failed = result
    assert sent == 10 and sent + full + failed == 40 and full >= 2
    new_layer(broker, flush=True, prefix=prefix)


def test_on_full_retry_gives_up_and_counts_full(spark, broker, prefix, new_layer):
    result = _send(
        broker,
        prefix,
        _one_channel(spark, 12),
        capacity=10,
        channel_col="ch",
        message_col="m",
        on_full="retry",
        retries=1,
    )
    assert result == (10, 2, 0)
    new_layer(broker, flush=True, prefix=prefix)


# -- schema errors (nothing is sent) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def typed(spark):
    return spark.createDataFrame(
        [("sp.t", 1, '{"a": 1}', None, None, None)],
        "ch string, n int, m string, ts timestamp, dec decimal(10,2), im map<int,string>",
    )


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(channel_col="nope", message_col="m"), ValueError, "'nope' is not a column"),
        (dict(channel_col="ch", message_col="nope"), ValueError, "'nope' is not a column"),
        (dict(channel_col="ch", message_cols=["m", "nope"]), ValueError, "'nope' is not a column"),
        (dict(channel_col="n", message_col="m"), TypeError, "must be a string column"),
        (dict(channel_col="ch", message_col="n"), TypeError, "string (JSON), struct or map"),
        (dict(channel_col="ch", message_cols=["m", "ts"]), TypeError, "'ts' has type timestamp"),
        (dict(channel_col="ch", message_cols=["dec"]), TypeError, "decimal(10,2)"),
        (dict(channel_col="ch", message_cols=["im"]), TypeError, "map with int keys"),
        (dict(channel_col="ch", group_col="ch", message_col="m"), ValueError, "exactly one"),
        (dict(channel_col="ch"), ValueError, "exactly one of message_col"),
        (dict(channel_col="ch", message_cols="m"), ValueError, "list of column names"),
        (dict(channel_col="ch", message_col="m", on_full="wait"), ValueError, "on_full"),
        (dict(channel_col="ch", message_col="m", jobs=0), ValueError, "jobs"),
        (dict(channel_col="ch", message_col="m", prefix="bad prefix!"), ValueError, "prefix"),
    ],
)
def test_schema_and_argument_errors_before_any_send(typed, broker, kwargs, error, text):
    kwargs.setdefault("prefix", "sp-never")
    with pytest.raises(error) as info:
        send_dataframe(typed, url=broker.amqp_url, **kwargs)
    assert text in str(info.value)


def test_nested_unsupported_type_names_the_field(spark, broker):
    df = spark.createDataFrame([("sp.t", None)], "ch string, m struct<a: struct<when: date>>")
    with pytest.raises(TypeError) as info:
        send_dataframe(df, url=broker.amqp_url, channel_col="ch", message_col="m")
    assert "field a.when" in str(info.value) and "date" in str(info.value)


def test_missing_pyspark_gives_an_install_hint():
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "try:\n    import asgi_amqp.spark\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    assert "pip install 'asgi-amqp-layer[spark]'" in out


# -- the example job -------------------------------------------------------------------------------


def test_notify_job_csv(spark, broker, prefix, layer, tmp_path, capsys):
    path = tmp_path / "notifications.csv"
    lines = ["channel,payload"] + ['sp.n%d,"{""n"": %d}"' % (i % 2, i) for i in range(50)]
    path.write_text("\n".join(lines) + "\n")
    status = notify_job.main(
        [
            str(path),
            "--url",
            broker.amqp_url,
            "--prefix",
            prefix,
            "--capacity",
            "5000",
            "--message-col",
            "payload",
        ],
        spark=spark,
    )
    assert status == 0
    err = capsys.readouterr().err
    assert "sent 50, channel full 0, failed 0" in err
    assert "guest:guest" not in err
    got = drain(layer, ["sp.n0", "sp.n1"])
    assert sorted(m["n"] for _, m in got) == list(range(50))


def test_notify_job_parquet_with_message_cols(spark, broker, prefix, layer, tmp_path, capsys):
    path = str(tmp_path / "n.parquet")
    spark.createDataFrame(
        [("sp.p", "t%d" % i, i) for i in range(20)], "channel string, title string, n long"
    ).write.parquet(path)
    status = notify_job.main(
        [
            path,
            "--url",
            broker.amqp_url,
            "--prefix",
            prefix,
            "--capacity",
            "5000",
            "--message-cols",
            "title,n",
            "--partitions",
            "2",
        ],
        spark=spark,
    )
    assert status == 0
    assert sorted(m["n"] for _, m in drain(layer, ["sp.p"])) == list(range(20))


def test_notify_job_bad_column_exits_2(spark, broker, prefix, tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text("who,payload\nsp.x,{}\n")
    status = notify_job.main([str(path), "--url", broker.amqp_url, "--prefix", prefix], spark=spark)
    assert status == 2
    assert "'channel' is not a column" in capsys.readouterr().err


# -- the application's settings, failures, the job's output ----------------------------------------


def test_failures_sample_names_the_first_rows_channel_and_reason(spark, broker, prefix, layer):
    rows = [("sp.ok", '{"i": 0}')] + [("sp.bad%d" % i, "{not json") for i in range(25)]
    df = spark.createDataFrame(rows, "ch string, m string").coalesce(1)
    result = _send(broker, prefix, df, channel_col="ch", message_col="m")
    assert result == (1, 0, 25)
    assert len(result.failures) == 20
    assert [f.channel for f in result.failures] == ["sp.bad%d" % i for i in range(20)]
    assert all(f.reason.startswith("invalid JSON") for f in result.failures)
    assert drain(layer, ["sp.ok"]) == [("sp.ok", {"i": 0})]


def test_failures_sample_tells_why_a_partition_stopped(spark, broker, prefix, new_layer):
    result = _send(
        broker,
        prefix,
        _one_channel(spark, 20).coalesce(1),
        capacity=5,
        channel_col="ch",
        message_col="m",
        on_full="fail",
    )
    assert result.sent == 5
    assert result.failures[-1].channel == "sp.full"
    assert "is full (on_full=fail): the partition stopped" in result.failures[-1].reason
    new_layer(broker, flush=True, prefix=prefix)


def test_layer_config_gives_queues_the_applications_arguments(spark, broker, prefix, new_layer):
    from helpers import Management

    new_layer(broker, flush=True, prefix=prefix)
    config = {"prefix": prefix, "capacity": 7, "expiry": 33, "group_expiry": 99}
    df = spark.createDataFrame([("sp.cfg", "{}"), ("sp.cfg2", "{}")], "ch string, m string")
    result = send_dataframe(
        df,
        url=broker.amqp_url,
        channel_col="ch",
        message_col="m",
        layer_config=config,
        channel_capacity={"sp.cfg2": 8},  # keyword options add to and override layer_config
    )
    assert result == (2, 0, 0)
    management = Management(broker)
    arguments = management.queue("%s:q:sp.cfg" % prefix)["arguments"]
    assert (arguments["x-max-length"], arguments["x-message-ttl"]) == (7, 33000)
    assert management.queue("%s:q:sp.cfg2" % prefix)["arguments"]["x-max-length"] == 8


def test_an_existing_queue_keeps_its_arguments_and_its_capacity(spark, broker, prefix, new_layer):
    app = new_layer(broker, flush=True, prefix=prefix, capacity=4, expiry=25)
    app.send("sp.old", {"i": -1})  # its queue: capacity 4, expiry 25
    # The sender reads existing queues' capacities from the management API,
    # whose listing follows a new queue a moment later (longer under load).
    api = Management(broker)
    queue = app.topology.channel_queue("sp.old")
    wait_until(
        lambda: queue in [q["name"] for q in api.queues(prefix)],
        15,
        message="the queue listed by the management API",
    )
    df = spark.createDataFrame(
        [("sp.old", '{"i": %d}' % i) for i in range(5)], "ch string, m string"
    )
    result = _send(
        broker, prefix, df.coalesce(1), channel_col="ch", message_col="m", on_full="skip"
    )
    assert result == (3, 2, 0)  # the queue's own capacity, 4, not the sender's 5000
    assert [m["i"] for _, m in drain(app, ["sp.old"])] == [-1, 0, 1, 2]


def test_unknown_layer_options_are_refused_on_the_driver(typed, broker):
    with pytest.raises(TypeError, match="unknown layer option 'hostz'"):
        send_dataframe(
            typed, channel_col="ch", message_col="m", layer_config={"hostz": [broker.amqp_url]}
        )


def test_hosts_in_the_applications_settings_reaches_the_broker(
    spark, broker, prefix, layer, monkeypatch
):
    """Issue 42: ``hosts`` worked in the application but Spark refused it."""
    monkeypatch.delenv("AMQP_URL", raising=False)  # the broker through hosts alone
    settings = {"hosts": [broker.amqp_url], "prefix": prefix, "capacity": 5000}
    df = _numbered(spark, 20)
    result = send_dataframe(
        df,
        channel_col="ch",
        message_col="json",
        layer_config=settings,
        management_url=broker.management_url,
    )
    from asgi_amqp.spark import SendResult

    assert result == SendResult(20, 0, 0)
    got = drain(layer, ["sp.c0", "sp.c1", "sp.c2", "sp.c3"])
    assert sorted(m["id"] for _, m in got) == list(range(20))


def test_notify_job_defaults_and_its_summary_is_the_last_line(broker, prefix, layer, tmp_path):
    assert notify_job.parse_args(["x.csv"]).on_full == "fail"  # as asgi-amqp send
    path = tmp_path / "n.csv"
    path.write_text('channel,message\nsp.j,"{""n"": 1}"\nbad name,{}\n')
    env = dict(
        os.environ,
        AMQP_URL=broker.amqp_url,
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH", "")] if p),
    )
    config = tmp_path / "layer.json"
    config.write_text(json.dumps({"prefix": prefix, "capacity": 5000}))
    job = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "notify_job.py"),
            str(path),
            "--config",
            str(config),
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert job.returncode == 1, job.stderr
    lines = job.stderr.strip().splitlines()
    found = re.match(
        r"^sent 1, channel full 0, failed 1 in [\d.]+ s \(([\d.]+) rows/s\)$", lines[-1]
    )
    assert found and float(found.group(1)) > 0, lines[-1]  # one row a few seconds: not "0"
    assert "notify_job: failed: bad name: " in job.stderr
    assert not [line for line in lines if " INFO " in line]  # Spark logs at WARN
    assert drain(layer, ["sp.j"]) == [("sp.j", {"n": 1})]

"""Turning a run into numbers: machine facts, the raw files of a run in
``results/raw/`` (:func:`write_raw`), the aggregation (pure Python;
``report_spark.py`` does the same with PySpark), the targets, summary.md /
summary.json and the tables printed at the end.
"""

import collections
import datetime
import json
import math
import os
import platform
import statistics
import subprocess

from . import common

# -- machine and versions ---------------------------------------------------------


def machine_info(admin):
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "os": _os_name(),
        "kernel": platform.release(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": "%s %s" % (platform.python_implementation(), platform.python_version()),
        "broker": admin.server_version(),
        "broker_platform": admin.server_platform(),
        "packages": common.package_versions(
            ["pika", "msgpack", "asgiref", "pyarrow", "pyspark", "pandas", "matplotlib"]
        ),
        "java": _java_version(),
        "git": common.git_revision(common.ROOT) or "no commit yet",
    }
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib():
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024.0 / 1024.0, 1)
    except OSError:
        pass
    return None


def _os_name():
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def _java_version():
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else None


# -- statistics ---------------------------------------------------------------------

PERCENTILES = (0.50, 0.95, 0.99)
# wakeup: the receive's return minus the end of the send (``dur_ns - value``),
# i.e. the wake-up once the broker had confirmed the message (may be < 0).
AFTER_SEND_PERCENTILES = (0.50, 0.99)


def percentile(sorted_values, fraction):
    """Linearly interpolated percentile of an ascending list (what Spark's
    ``percentile`` and numpy's default compute)."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * fraction
    low = int(math.floor(position))
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _ms(ns):
    return None if ns is None else round(ns / 1e6, 4)


def aggregate_python(samples, rounds, run):
    """The aggregation without Spark: the same figures as ``report_spark``.

    ``samples``/``rounds``: lists of dicts (the raw files' rows). Returns
    ``{scenario: {contestant: stats}}``.
    """
    durations = collections.defaultdict(list)
    after_send = collections.defaultdict(list)
    misses = collections.Counter()
    for row in samples:
        key = (row["scenario"], row["contestant"])
        if row["ok"]:
            durations[key].append(row["dur_ns"])
            if row["value"] is not None:
                after_send[key].append(row["dur_ns"] - row["value"] * 1e6)
        else:
            misses[key] += 1
    per_round = collections.defaultdict(list)
    for row in rounds:
        per_round[(row["scenario"], row["contestant"])].append(row)
    stats = {}
    for (scenario, contestant), rows in per_round.items():
        rows.sort(key=lambda r: r["round"])
        rates = [r["units"] / r["wall_s"] if r["wall_s"] else 0.0 for r in rows]
        deliveries = [
            r["delivered"] / r["wall_s"]
            for r in rows
            if r.get("delivered") is not None and r["wall_s"]
        ]
        durs = sorted(durations.get((scenario, contestant), []))
        entry = {
            "rounds": len(rows),
            "ops_per_round": rows[0]["ops"],
            "rates": [round(r, 1) for r in rates],
            "rate_median": statistics.median(rates) if rates else None,
            "rate_min": min(rates) if rates else None,
            "rate_max": max(rates) if rates else None,
            "deliveries_median": statistics.median(deliveries) if deliveries else None,
            "samples": len(durs),
            "misses": misses.get((scenario, contestant), 0),
            "errors": sum(r["error_count"] for r in rows),
            "problems": sum(r["problem_count"] for r in rows),
            "mean_ms": _ms(sum(durs) / len(durs)) if durs else None,
            "max_ms": _ms(durs[-1]) if durs else None,
        }
        for fraction in PERCENTILES:
            entry["p%d_ms" % round(fraction * 100)] = _ms(percentile(durs, fraction))
        after = sorted(after_send.get((scenario, contestant), []))
        for fraction in AFTER_SEND_PERCENTILES:
            entry["after_send_p%d_ms" % round(fraction * 100)] = _ms(percentile(after, fraction))
        stats.setdefault(scenario, {})[contestant] = entry
    return finish_stats(stats, run)


def finish_stats(stats, run):
    """Headlines and ratios to each scenario's baseline (shared by both aggregations)."""
    kinds = {s["name"]: s for s in run["scenarios"]}
    for scenario, per in stats.items():
        info = kinds.get(scenario, {})
        for entry in per.values():
            if info.get("kind") == "latency":
                entry["headline"] = entry.get("p50_ms")
            else:
                entry["headline"] = entry.get("rate_median")
        base = per.get(info.get("baseline"))
        for entry in per.values():
            if base and base.get("headline") and entry.get("headline") is not None:
                entry["ratio_to_baseline"] = round(entry["headline"] / base["headline"], 3)
            else:
                entry["ratio_to_baseline"] = None
    return stats


# -- targets --------------------------------------------------------------------------

_STAT_KEYS = {
    "headline": "headline",
    "deliveries": "deliveries_median",
    "p50": "p50_ms",
    "p95": "p95_ms",
    "p99": "p99_ms",
}


def evaluate_targets(stats, run):
    rows = []
    for target in run["targets"]:
        key = _STAT_KEYS[target["stat"]]
        subject = stats.get(target["scenario"], {}).get(target["subject"], {}).get(key)
        row = dict(target)
        row["measured"] = subject
        row["against"] = None
        row["value"] = None
        if target.get("other"):
            against = stats.get(target["scenario"], {}).get(target["other"], {}).get(key)
            row["against"] = against
            if subject is not None and against:
                row["value"] = subject / against
        else:
            row["value"] = subject
        if row["value"] is None:
            row["status"] = "n/a"
        else:
            ok = (
                row["value"] >= target["goal"]
                if target["op"] == ">="
                else row["value"] <= target["goal"]
            )
            row["status"] = "PASS" if ok else "SHORT"
        rows.append(row)
    return rows


def _fmt_number(value, unit=""):
    if value is None:
        return "-"
    if unit == "ms":
        return "%.3f ms" % value
    if abs(value) >= 100:
        return "{:,.0f}".format(value)
    return "%.3g" % value


def targets_table(rows, stats, run):
    scenarios = {s["name"]: s for s in run["scenarios"]}
    headers = ["target", "layer", "compared with", "ratio / value", "goal", "status"]
    out = []
    for row in rows:
        unit = row.get("bound_unit") or ("ms" if row["stat"] in ("p50", "p95", "p99") else "")
        scenario = scenarios.get(row["scenario"], {})
        what = _stat_label(row["stat"], scenario)
        subject = (
            "%s %s" % (_fmt_number(row["measured"], unit), what)
            if row["measured"] is not None
            else "-"
        )
        if row.get("other"):
            against = "%s: %s %s" % (row["other"], _fmt_number(row["against"], unit), what)
            value = "-" if row["value"] is None else "%.2fx" % row["value"]
            goal = "%s %sx" % (row["op"], _fmt_goal(row["goal"]))
        else:
            against = "(fixed bound)"
            value = _fmt_number(row["value"], row.get("bound_unit") or "")
            goal = "%s %s" % (row["op"], _fmt_number(row["goal"], row.get("bound_unit") or ""))
        mark = {"PASS": "PASS", "SHORT": "**SHORT**", "n/a": "n/a"}[row["status"]]
        out.append([row["text"], subject, against, value, goal, mark])
    return headers, out


def _fmt_goal(goal):
    """1.0 -> "1.0", 0.25 -> "0.25" (one decimal unless the goal has more)."""
    return "%.1f" % goal if round(goal, 1) == goal else "%g" % goal


def _stat_label(stat, scenario):
    if stat in ("p50", "p95", "p99"):
        return stat
    if stat == "deliveries":
        return "deliveries/s"
    if scenario.get("kind") == "latency":
        return "p50"
    return scenario.get("metric", "")


# -- tables -----------------------------------------------------------------------------


def _order(run, per):
    names = [c["name"] for c in run["contestants"] if c["name"] in per]
    return names + [n for n in per if n not in names]


def summary_table(stats, run):
    """One row per scenario (and a deliveries row for fan-out), a column per contestant."""
    names = []
    for scenario in run["scenarios"]:
        for name in _order(run, stats.get(scenario["name"], {})):
            if name not in names:
                names.append(name)
    headers = ["scenario", "metric"] + names
    rows = []
    for scenario in run["scenarios"]:
        per = stats.get(scenario["name"])
        if not per:
            continue
        label = "(%s) %s" % (scenario["letter"], scenario["name"])
        if scenario["kind"] == "latency":
            for stat in ("p50", "p95", "p99"):
                rows.append(
                    [label if stat == "p50" else "", "%s %s ms" % (scenario["metric"], stat)]
                    + [_fmt(per.get(n, {}).get(stat + "_ms"), "%.3f") for n in names]
                )
            if any(per.get(n, {}).get("after_send_p50_ms") is not None for n in names):
                for stat in ("p50", "p99"):
                    rows.append(
                        ["", "after the send returned, %s ms" % stat]
                        + [
                            _fmt(per.get(n, {}).get("after_send_%s_ms" % stat), "%.3f")
                            for n in names
                        ]
                    )
        else:
            rows.append(
                [label, scenario["metric"] + " median"]
                + [_fmt(per.get(n, {}).get("rate_median"), "{:,.0f}") for n in names]
            )
            if scenario.get("fanout"):
                rows.append(
                    ["", "member deliveries/s"]
                    + [_fmt(per.get(n, {}).get("deliveries_median"), "{:,.0f}") for n in names]
                )
    return headers, rows


def ratio_subjects(run):
    """(subject, others) pairs for ratio tables: ``layer`` against every
    other contestant, and with a baseline, ``layer@current`` against
    ``layer@baseline``."""
    names = [c["name"] for c in run["contestants"]]
    pairs = []
    if "layer" in names:
        pairs.append(("layer", [n for n in names if n != "layer"]))
    if "layer@current" in names and "layer@baseline" in names:
        pairs.append(("layer@current", ["layer@baseline"]))
    return pairs


def ratio_table(stats, run, subject, others):
    """``subject``'s headline figures divided by each of ``others``': per
    second (median round; above 1 means ``subject`` is faster) and latency
    percentiles (below 1 means ``subject`` is faster)."""
    headers = ["scenario", "figure"] + ["%s / %s" % (subject, other) for other in others]
    rows = []

    def ratio(per, other, key):
        mine = per.get(subject, {}).get(key)
        theirs = per.get(other, {}).get(key)
        return "-" if not mine or not theirs else "%.2fx" % (mine / theirs)

    for scenario in run["scenarios"]:
        per = stats.get(scenario["name"])
        if not per or subject not in per:
            continue
        label = "(%s) %s" % (scenario["letter"], scenario["name"])
        if scenario["kind"] == "latency":
            figures = [("p50 ms", "p50_ms"), ("p99 ms", "p99_ms")]
        else:
            figures = [(scenario["metric"], "rate_median")]
            if scenario.get("fanout"):
                figures.append(("member deliveries/s", "deliveries_median"))
        for k, (what, key) in enumerate(figures):
            rows.append([label if k == 0 else "", what] + [ratio(per, o, key) for o in others])
    return headers, rows


def detail_table(scenario, per, run):
    headers = [
        "contestant",
        "rounds",
        "median",
        "min",
        "max",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "ratio to %s" % (scenario.get("baseline") or "-"),
        "misses/errors/problems",
    ]
    rows = []
    for name in _order(run, per):
        s = per[name]
        rate = "{:,.0f}"
        rows.append(
            [
                name,
                s["rounds"],
                _fmt(s.get("rate_median"), rate),
                _fmt(s.get("rate_min"), rate),
                _fmt(s.get("rate_max"), rate),
                _fmt(s.get("p50_ms"), "%.3f"),
                _fmt(s.get("p95_ms"), "%.3f"),
                _fmt(s.get("p99_ms"), "%.3f"),
                _fmt(s.get("max_ms"), "%.3f"),
                _fmt(s.get("ratio_to_baseline"), "%.2f"),
                "%d/%d/%d" % (s["misses"], s["errors"], s["problems"]),
            ]
        )
    return headers, rows


def _fmt(value, fmt):
    if value is None:
        return "-"
    return fmt.format(value) if "{" in fmt else fmt % value


def render_text(table):
    headers, rows = table
    everything = [headers] + rows
    widths = [max(len(str(row[i])) for row in everything) for i in range(len(headers))]
    lines = []
    for row in everything:
        cells = [
            str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i])
            for i, c in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render_markdown(table, left=1):
    headers, rows = table
    lines = [
        "| " + " | ".join(str(h) for h in headers) + " |",
        "|" + "|".join(["---"] * left + ["---:"] * (len(headers) - left)) + "|",
    ]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- raw files -----------------------------------------------------------------------------


# Spark SQL's types, as pyarrow names them.
_ARROW_TYPES = {
    "STRING": "string",
    "INT": "int32",
    "BIGINT": "int64",
    "DOUBLE": "float64",
    "BOOLEAN": "bool_",
}


def _arrow_schema(pyarrow, ddl):
    """The Parquet schema of the columns in ``ddl`` (``Recorder.SAMPLES_DDL``)."""
    columns = [column.split() for column in ddl.split(",")]
    return pyarrow.schema(
        [(name, getattr(pyarrow, _ARROW_TYPES[kind])()) for name, kind in columns]
    )


def write_raw(recorder, run, directory, stamp):
    """``samples-<stamp>.parquet`` (a row per timed operation) and
    ``rounds-<stamp>.parquet`` (a row per round), JSON lines without pyarrow,
    and ``run-<stamp>.json``, what is needed to read them (scenarios,
    targets, contestants and their versions, machine, options)."""
    os.makedirs(directory, exist_ok=True)
    rounds = [
        {
            k: (json.dumps(r[k]) if k in ("errors", "problems") else r.get(k))
            for k in recorder.ROUND_COLUMNS
        }
        for r in recorder.rounds
    ]
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        pyarrow = None
    if pyarrow is not None:
        samples_path = os.path.join(directory, "samples-%s.parquet" % stamp)
        rounds_path = os.path.join(directory, "rounds-%s.parquet" % stamp)
        schema = _arrow_schema(pyarrow, recorder.SAMPLES_DDL)
        columns = list(zip(*recorder.samples)) if recorder.samples else [[]] * len(schema)
        table = pyarrow.table(
            {name: list(columns[i]) for i, name in enumerate(schema.names)}, schema=schema
        )
        pyarrow.parquet.write_table(table, samples_path)
        round_schema = _arrow_schema(pyarrow, recorder.ROUNDS_DDL)
        pyarrow.parquet.write_table(
            pyarrow.Table.from_pylist(rounds, schema=round_schema), rounds_path
        )
    else:
        samples_path = os.path.join(directory, "samples-%s.jsonl" % stamp)
        rounds_path = os.path.join(directory, "rounds-%s.jsonl" % stamp)
        with open(samples_path, "w") as handle:
            for row in recorder.samples:
                handle.write(
                    json.dumps(dict(zip(recorder.COLUMNS, row)), separators=(",", ":")) + "\n"
                )
        with open(rounds_path, "w") as handle:
            for row in rounds:
                handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    run = dict(run)
    run["samples_file"] = os.path.basename(samples_path)
    run["rounds_file"] = os.path.basename(rounds_path)
    run["round_details"] = [
        {k: r[k] for k in ("scenario", "contestant", "round", "slot", "errors", "problems")}
        for r in recorder.rounds
        if r["errors"] or r["problems"]
    ]
    run_path = os.path.join(directory, "run-%s.json" % stamp)
    with open(run_path, "w") as handle:
        json.dump(run, handle, indent=2)
        handle.write("\n")
    return run_path


def load_run(run_path):
    with open(run_path) as handle:
        run = json.load(handle)
    run["_dir"] = os.path.dirname(os.path.abspath(run_path))
    return run


def read_rows(run, which):
    """The raw rows of ``which`` ("samples" or "rounds") as dicts (no Spark)."""
    path = os.path.join(run["_dir"], run[which + "_file"])
    if path.endswith(".parquet"):
        import pyarrow.parquet

        return pyarrow.parquet.read_table(path).to_pylist()
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


# -- summary.md / summary.json --------------------------------------------------------


def write_outputs(stats, run, results_dir, engine):
    """summary.md and summary.json; returns (target rows, paths)."""
    os.makedirs(results_dir, exist_ok=True)
    targets = evaluate_targets(stats, run)
    document = {k: v for k, v in run.items() if not k.startswith("_")}
    document["aggregated_by"] = engine
    document["stats"] = stats
    document["targets_evaluated"] = targets
    path_json = os.path.join(results_dir, "summary.json")
    with open(path_json, "w") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    path_md = os.path.join(results_dir, "summary.md")
    with open(path_md, "w") as handle:
        handle.write(render_summary_md(stats, run, targets, engine))
    return targets, [path_md, path_json]


def render_summary_md(stats, run, targets, engine):
    machine = run["machine"]
    passed = sum(1 for t in targets if t["status"] == "PASS")
    lines = [
        "# asgi_amqp benchmark",
        "",
        "`%s`, %s (UTC), %.0f s; aggregated by %s."
        % (run["command"], machine["date_utc"], run.get("elapsed_s", 0), engine),
        "",
        "| machine | |",
        "|---|---|",
        "| CPU | %s, %s cores (%s usable) |"
        % (machine["cpu_model"], machine["nproc"], machine["cpus_usable"]),
        "| memory | %s GiB |" % machine["memory_gib"],
        "| OS | %s, kernel %s |" % (machine["os"], machine["kernel"]),
        "| load at start / end | %s / %s |"
        % (
            " ".join(str(x) for x in machine["loadavg_at_start"]),
            " ".join(str(x) for x in run.get("loadavg_at_end", [])),
        ),
        "| Python | %s |" % machine["python"],
        "| broker | %s (%s), %s |"
        % (machine["broker"], machine["broker_platform"], run["broker_url"]),
        "| Redis | %s |" % (run.get("redis") or "-"),
        "| packages | %s |" % ", ".join("%s %s" % kv for kv in sorted(machine["packages"].items())),
        "| Java | %s |" % (machine.get("java") or "-"),
        "| asgi_amqp | %s, git %s |" % (run["asgi_amqp_version"], machine["git"]),
        "",
        "## Targets (%d of %d pass)" % (passed, len(targets)),
        "",
        render_markdown(targets_table(targets, stats, run)),
        "",
        "## Summary",
        "",
        "Rates: median of the rounds; latencies: percentiles over every sample of every round.",
        "",
        render_markdown(summary_table(stats, run), left=2),
        "",
    ]
    for subject, others in ratio_subjects(run):
        lines += [
            "## %s against the others" % subject,
            "",
            "Rates: %s's median round over the other's (above 1: %s is faster); "
            "latencies: %s's percentile over the other's (below 1: %s is faster)."
            % (subject, subject, subject, subject),
            "",
            render_markdown(ratio_table(stats, run, subject, others), left=2),
            "",
        ]
    if run.get("baseline"):
        lines += ["layer@baseline: %s." % run["baseline"], ""]
    lines += [
        "## Method",
        "",
        run["method"],
        "",
    ]
    for scenario in run["scenarios"]:
        per = stats.get(scenario["name"])
        if not per:
            continue
        lines += [
            "## %s" % scenario["title"],
            "",
            scenario["description"],
            "",
            render_markdown(detail_table(scenario, per, run)),
            "",
        ]
        lines += [
            "Per-round rates: "
            + "; ".join(
                "%s %s" % (name, ", ".join("{:,.0f}".format(r) for r in per[name]["rates"]))
                for name in _order(run, per)
            ),
            "",
        ]
        problems = [
            d
            for d in run.get("round_details", [])
            if d["scenario"] == scenario["name"] and (d["errors"] or d["problems"])
        ]
        if problems:
            lines += ["Errors and failed checks:", ""]
            for d in problems[:20]:
                for text in (d["errors"] or [])[:3] + (d["problems"] or [])[:3]:
                    lines.append("- %s round %d: %s" % (d["contestant"], d["round"], text))
            lines.append("")
    lines += ["## Contestants", ""]
    for c in run["contestants"]:
        versions = ", ".join("%s %s" % kv for kv in sorted((c.get("versions") or {}).items()))
        lines.append(
            "- **%s**: %s%s" % (c["name"], c["description"], " (%s)" % versions if versions else "")
        )
    for name, reason in sorted((run.get("skipped_contestants") or {}).items()):
        lines.append("- **%s**: not run: %s" % (name, reason))
    lines.append("")
    return "\n".join(lines)


def print_report(stats, run, targets, out=print):
    out("\nSummary")
    out(render_text(summary_table(stats, run)))
    for subject, others in ratio_subjects(run):
        out(
            "\n%s against the others (rates: above 1 is faster; latencies: below 1 is faster)"
            % subject
        )
        out(render_text(ratio_table(stats, run, subject, others)))
    out("\nTargets")
    out(render_text(targets_table(targets, stats, run)).replace("**SHORT**", "SHORT <--"))

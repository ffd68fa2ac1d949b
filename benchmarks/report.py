"""Turning a run into numbers: machine facts, per-contestant statistics, the
raw samples file, summary.md / summary.json and the table printed at the end."""

import datetime
import json
import math
import os
import platform
import statistics
import subprocess

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
        "broker_platform": _text(admin.server_properties.get("platform", "")),
        "packages": _package_versions(["pika", "msgpack", "asgiref", "asgi_redis", "pyarrow"]),
        "git": _git_revision(),
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


def _package_versions(names):
    from importlib import metadata
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _git_revision():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "asgi_amqp"], cwd=root,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return "no commit yet"
    return head.stdout.strip() + ("+local changes" if dirty.stdout.strip() else "")


def _text(value):
    return value.decode("utf8", "replace") if isinstance(value, bytes) else str(value)


# -- statistics ---------------------------------------------------------------------


def percentile(sorted_values, fraction):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = math.ceil(round(fraction * len(sorted_values), 9))  # round(): 0.99*3000 is 2969.999...
    index = min(len(sorted_values) - 1, max(0, rank - 1))
    return sorted_values[index]


def summarize(recorder, scenarios, contestants):
    """{scenario: {contestant: stats}} from the recorder's rounds and samples."""
    durations = {}
    for sample in recorder.samples:
        _, scenario, contestant, _, _, _, _, dur_ns, ok, _ = sample
        if ok:
            durations.setdefault((scenario, contestant), []).append(dur_ns)
    results = {}
    for scenario in scenarios:
        per = {}
        for contestant in contestants:
            rounds = [r for r in recorder.rounds
                      if r["scenario"] == scenario.name and r["contestant"] == contestant.name]
            if not rounds:
                continue
            rates = [r["rate"] for r in rounds]
            durs = sorted(durations.get((scenario.name, contestant.name), []))
            stats = {
                "rounds": len(rounds),
                "ops_per_round": rounds[0]["ops"],
                "rates": rates,
                "rate_median": statistics.median(rates),
                "rate_min": min(rates),
                "rate_max": max(rates),
                "op_ms_p50": _ms(percentile(durs, 0.50)),
                "op_ms_p90": _ms(percentile(durs, 0.90)),
                "op_ms_p99": _ms(percentile(durs, 0.99)),
                "op_ms_max": _ms(durs[-1] if durs else None),
                "misses": sum(r["misses"] for r in rounds),
                "errors": sum(r["error_count"] for r in rounds),
                "problems": [p for r in rounds for p in r["problems"]],
            }
            stats["headline"] = (stats["rate_median"] if scenario.kind == "rate"
                                 else stats["op_ms_p50"])
            per[contestant.name] = stats
        base = per.get(scenario.baseline)
        for name, stats in per.items():
            if base and base["headline"]:
                stats["ratio_to_baseline"] = round(stats["headline"] / base["headline"], 3)
            else:
                stats["ratio_to_baseline"] = None
        results[scenario.name] = per
    return results


def _ms(ns):
    return None if ns is None else round(ns / 1e6, 4)


# -- output ------------------------------------------------------------------------------


def write_samples(recorder, directory, stamp):
    """The raw samples as parquet (if pyarrow imports) or JSON lines; returns the path."""
    os.makedirs(directory, exist_ok=True)
    columns = recorder.COLUMNS
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        pyarrow = None
    if pyarrow is not None:
        path = os.path.join(directory, "samples-%s.parquet" % stamp)
        table = pyarrow.table({name: [row[i] for row in recorder.samples]
                               for i, name in enumerate(columns)})
        pyarrow.parquet.write_table(table, path)
        return path
    path = os.path.join(directory, "samples-%s.jsonl" % stamp)
    with open(path, "w") as handle:
        for row in recorder.samples:
            handle.write(json.dumps(dict(zip(columns, row)), separators=(",", ":")))
            handle.write("\n")
    return path


def _columns(scenario, stats, contestant_names):
    """Contestants in table order: the subject(s) first, the baseline last."""
    names = [n for n in contestant_names if n in stats and n != scenario.baseline]
    if scenario.baseline in stats:
        names.append(scenario.baseline)
    return names


def _value(scenario, value):
    if value is None:
        return "-"
    if scenario.kind == "rate":
        return "{:,.0f}".format(value)
    return "%.3f" % value


def headline_table(scenarios, results, contestant_names):
    """(headers, rows): one row per scenario, a column per contestant, ratio columns."""
    layout = []
    for scenario in scenarios:
        for name in _columns(scenario, results.get(scenario.name, {}), contestant_names):
            if name not in layout:
                layout.append(name)
    baselines = [n for n in layout if any(n == s.baseline for s in scenarios)]
    subjects = [n for n in layout if n not in baselines]
    headers = ["scenario", "metric"] + subjects + baselines
    headers += ["%s/%s" % (name, base) for name in subjects for base in baselines]
    rows = []
    for scenario in scenarios:
        stats = results.get(scenario.name, {})
        if not stats:
            continue
        row = [scenario.name, scenario.metric + (" median" if scenario.kind == "rate"
                                                 else " p50 ms")]
        row += [_value(scenario, stats.get(n, {}).get("headline")) for n in subjects + baselines]
        for name in subjects:
            for base in baselines:
                a = stats.get(name, {}).get("headline")
                b = stats.get(base, {}).get("headline")
                row.append("%.2f" % (a / b) if a and b else "-")
        rows.append(row)
    return headers, rows


def detail_table(scenario, stats, contestant_names):
    """(headers, rows): one row per contestant of one scenario."""
    headers = ["contestant", scenario.metric + " median", "min", "max",
               "op p50 ms", "op p99 ms", "op max ms", "ratio", "misses/errors"]
    rows = []
    for name in _columns(scenario, stats, contestant_names):
        s = stats[name]
        rows.append([
            name,
            _value(scenario, s["headline"]),
            _value(scenario, s["rate_min"]),
            _value(scenario, s["rate_max"]),
            _opt("%.3f", s["op_ms_p50"]),
            _opt("%.3f", s["op_ms_p99"]),
            _opt("%.3f", s["op_ms_max"]),
            _opt("%.2f", s["ratio_to_baseline"]),
            "%d/%d" % (s["misses"], s["errors"]),
        ])
    return headers, rows


def _opt(fmt, value):
    return "-" if value is None else fmt % value


def render_text(table):
    headers, rows = table
    everything = [headers] + rows
    widths = [max(len(str(row[i])) for row in everything) for i in range(len(headers))]
    lines = []
    for row in everything:
        cells = [str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i])
                 for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render_markdown(table):
    headers, rows = table
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_summary(path_md, path_json, meta, scenarios, results, contestants, recorder):
    names = [c.name for c in contestants]
    document = dict(meta)
    document["contestants"] = [{"name": c.name, "description": c.description,
                                "versions": c.versions()} for c in contestants]
    document["scenarios"] = [{"name": s.name, "title": s.title, "metric": s.metric,
                              "kind": s.kind, "baseline": s.baseline,
                              "description": s.description,
                              "results": results.get(s.name, {})} for s in scenarios]
    document["round_results"] = recorder.rounds
    with open(path_json, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=False)
        handle.write("\n")

    machine = meta["machine"]
    lines = [
        "# asgi_amqp benchmark",
        "",
        "Run `%s` on %s (UTC)." % (meta["command"], machine["date_utc"]),
        "",
        "| machine | |",
        "|---|---|",
        "| CPU | %s, %s cores (%s usable) |" % (machine["cpu_model"], machine["nproc"],
                                                machine["cpus_usable"]),
        "| memory | %s GiB |" % machine["memory_gib"],
        "| OS | %s, kernel %s |" % (machine["os"], machine["kernel"]),
        "| load at start | %s |" % " ".join(str(x) for x in machine["loadavg_at_start"]),
        "| Python | %s |" % machine["python"],
        "| broker | %s (%s), %s |" % (machine["broker"], machine["broker_platform"],
                                       meta["broker_url"]),
        "| packages | %s |" % ", ".join("%s %s" % kv for kv in sorted(machine["packages"].items())),
        "| asgi_amqp | %s, git %s |" % (meta["asgi_amqp_version"], machine["git"]),
        "",
        "Method: %d rounds of %d operations per scenario and contestant, after a "
        "%d-operation warm-up; the order of contestants rotates every round "
        "(AB, BA, ...). A round's rate is its successful operations divided by its "
        "wall time; the headline is the median over rounds, the ratio is "
        "contestant / baseline. Raw samples (one row per operation): `%s`." % (
            meta["rounds"], meta["ops"], meta["warmup_ops"], meta["samples_file"]),
        "",
        "## Summary",
        "",
        render_markdown(headline_table(scenarios, results, names)),
        "",
    ]
    for scenario in scenarios:
        stats = results.get(scenario.name)
        if not stats:
            continue
        lines += [
            "## %s" % scenario.title,
            "",
            scenario.description,
            "",
            render_markdown(detail_table(scenario, stats, names)),
            "",
            "Per-round rates: " + "; ".join(
                "%s %s" % (name, ", ".join("{:,.0f}".format(r) for r in stats[name]["rates"]))
                for name in _columns(scenario, stats, names)),
            "",
        ]
        problems = [(n, p) for n in stats for p in stats[n]["problems"]]
        if problems:
            lines += ["Problems found by the checks:", ""]
            lines += ["- %s: %s" % (n, p) for n, p in problems[:20]]
            lines.append("")
    lines += ["## Contestants", ""]
    lines += ["- **%s**: %s" % (c.name, c.description) for c in contestants]
    lines.append("")
    with open(path_md, "w") as handle:
        handle.write("\n".join(lines))

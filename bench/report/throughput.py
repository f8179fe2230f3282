"""Sections 1, 5 and 11: eos's throughput against its baselines, how it scales with partitions and
epoch sizes, and on a Spark standalone cluster; with their targets."""

from __future__ import annotations

from typing import Any

from bench.report.tables import (
    cpu_cell,
    cpu_table,
    median_of,
    n,
    rate_text,
    ratio,
    span,
    span_of,
    table,
    target,
    titled,
)  # fmt: skip
from bench.runs import ALO, BUILTIN, CONFIGS, EO, RAW, RAW_TXN, SPARK_CONFIGS
from bench.stats import balanced_orders, by_round, line_fit, paired_ratio, ratio_summary, summarize, verdict

# Exactly-once against each baseline: (baseline, lowest ratio, how the summary names it)
TARGETS = (
    (BUILTIN, 1.0, "Spark built-in Kafka (same transforms)"),
    (ALO, 0.95, "eos at-least-once"),
    (RAW, 0.5, "raw confluent-kafka loop"),
)
# The paired ratios shown: the targets' comparisons, and each configuration against the next simpler one
PAIRS = ((EO, ALO), (EO, BUILTIN), (EO, RAW), (ALO, BUILTIN), (BUILTIN, RAW), (RAW_TXN, RAW), (EO, RAW_TXN))


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


@titled("throughput", "1. Throughput")
def throughput(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    inp = section["input"]
    perf = section["perf"]
    out = [
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
    ceiling = ratio(ratio_summary(perf["ceiling_rps"], perf["producer_rps"]))
    out += table(
        ["tool", "records/s", "baseline", "ratio"],
        [
            ["ProducerPerformance", span(perf["producer"]), "–", "–"],
            ["ConsumerPerformance (read_committed)", span(perf["consumer"]), "–", "–"],
            ["ceiling = min(producer, consumer)", span(summarize(perf["ceiling_rps"])), "ProducerPerformance", ceiling],
        ],
    )
    for pipeline, data in section["pipelines"].items():
        runs = data["runs"]
        out += [f"### {pipeline.capitalize()} pipeline", ""]
        rows = []
        for config in CONFIGS:
            rs = runs.get(config, [])
            if rs:
                vs_ceiling = ratio(ratio_summary([r["rps_wall"] for r in rs], perf["ceiling_rps"]))
                epochs = n(summarize([len(r["epochs"]) for r in rs]).median)
                rows.append([config, span_of(rs, "rps_wall"), cpu_cell(rs), span_of(rs, "rps_epochs"), epochs,
                             n(median_of(rs, "records_out")), "machine ceiling", vs_ceiling])  # fmt: skip
        out += table(
            ["configuration", "records/s (wall)", "CPU µs/record (all our processes)", "records/s (epoch time)",
             "epochs", "records out", "baseline", "ratio (wall)"],
            rows,
        )  # fmt: skip
        outs = {c: {r["records_out"] for r in runs.get(c, [])} for c in CONFIGS if runs.get(c)}
        if pipeline == "stateless" and len({x for s in outs.values() for x in s}) > 1:
            out += [f"**Output counts differ between configurations:** {outs}", ""]
        out += ["Paired ratios (the target comparisons, and each configuration against the next simpler one):", ""]
        rows = []
        for config, base in PAIRS:
            if runs.get(config) and runs.get(base):
                both_spark = config in SPARK_CONFIGS and base in SPARK_CONFIGS
                ep = ratio(paired_ratio(runs, config, base, "rps_epochs")) if both_spark else "–"
                rows.append([config, base, ratio(paired_ratio(runs, config, base)), ep])
        out += table(["configuration", "baseline", "ratio (wall)", "ratio (epoch time)"], rows)
        out += host_checks(runs)
        out += cpu_table(runs)
    return out


def throughput_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for pipeline, data in ((results.get("throughput") or {}).get("pipelines") or {}).items():
        runs = data["runs"]
        for base, least, label in TARGETS:
            s = paired_ratio(runs, EO, base)
            rows.append(
                target(f"throughput, {pipeline}: exactly-once vs {label}", rate_text(runs.get(EO, [])),
                       f"{base}: {rate_text(runs.get(base, []))}", ratio(s), f"≥ {least}×", verdict(s.median, least))
            )  # fmt: skip
    return rows


def _cost_us(rows: list[dict[str, Any]]) -> Any:
    """µs of epoch time per input record, over runs."""
    return summarize([r["epoch_time_s"] / r["records_in"] * 1e6 for r in rows])


@titled("scaling", "5. Scaling")
def scaling(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    out = [
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
        rps, cost = summarize([r["rps_wall"] for r in rs]), _cost_us(rs)
        base = base or (partitions, rps, cost)
        rows.append([partitions, span(rps), cpu_cell(rs), span_of(rs, "rps_epochs"), n(cost.median, 1),
                     f"{base[0]} partition(s)", f"{rps.median / base[1].median:.2f}×",
                     f"{cost.median / base[2].median:.2f}×"])  # fmt: skip
    out += table(
        ["partitions", "records/s (wall)", "CPU µs/record", "records/s (epoch time)", "µs per record", "baseline",
         "ratio (records/s)", "ratio (µs per record)"],
        rows,
    )  # fmt: skip
    out += ["**Epoch size** (4 partitions): exactly-once and at-least-once; baseline: the smallest epoch size.", ""]
    sizes: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for row in section["epoch_sizes"]:
        sizes.setdefault(row["epoch_records"], {}).setdefault(row["config"], []).append(row)
    rows, base = [], None
    eo_epochs: list[dict[str, Any]] = []
    for size, by_config in sizes.items():
        eo, alo = by_config.get(EO, []), by_config.get(ALO, [])
        eo_epochs += [e for r in eo for e in r["epochs"] if e.get("records_out")]
        rps, cost = summarize([r["rps_wall"] for r in eo]), _cost_us(eo)
        base = base or (size, rps, cost)
        eo_alo = ratio(ratio_summary([r["rps_wall"] for r in eo], [r["rps_wall"] for r in alo]))
        rows.append([f"{size:,}", span(rps), cpu_cell(eo), span_of(alo, "rps_wall"), cpu_cell(alo), eo_alo,
                     n(cost.median, 1), n(_cost_us(alo).median, 1), f"{base[0]:,}",
                     f"{rps.median / base[1].median:.2f}×", f"{cost.median / base[2].median:.2f}×"])  # fmt: skip
    out += table(
        ["max records per epoch", "exactly-once records/s", "EO CPU µs/record", "at-least-once records/s",
         "ALO CPU µs/record", "ratio EO/ALO", "EO µs per record", "ALO µs per record", "baseline",
         "ratio (EO records/s)", "ratio (EO µs per record)"],
        rows,
    )  # fmt: skip
    if len(eo_epochs) >= 3:
        a, b, r2 = line_fit([e["input_rows"] or 0 for e in eo_epochs], [e["trigger_s"] for e in eo_epochs])
        out += [
            f"Line fit over {len(eo_epochs)} exactly-once epochs of these runs: epoch time ≈ **{a:.2f} s** fixed "
            f"per epoch + **{b * 1e6:.1f} µs** per input record (r² = {r2:.2f}).",
            "",
        ]
    return out


def _vs_local(rs: list[dict[str, Any]], local: list[dict[str, Any]]) -> Any:
    paired = by_round(rs, local)
    return ratio_summary([a["rps_steady"] for a, _ in paired], [b["rps_steady"] for _, b in paired])


@titled("cluster", "11. Spark standalone cluster and scale-out")
def cluster(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    from bench.sections.cluster import CORES, LOCAL

    inp = section["input"]
    out = [
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
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["where"], r["cores"]), []).append(r)
    local = [r for r in runs if r["where"] == LOCAL]
    rows = []
    for key in [(LOCAL, 2), *(("standalone", c) for c in CORES)]:
        rs = by.get(key, [])
        if rs:
            epoch = span(summarize([r["epoch_s"]["median"] for r in rs]), 2, " s")
            rows.append([f"{key[0]}, {key[1]} core(s)", span_of(rs, "rps_steady"), span_of(rs, "rps_wall"),
                         cpu_cell(rs), epoch, n(summarize([len(r["epochs"]) for r in rs]).median),
                         n(summarize([r["records_out"] for r in rs]).median), ratio(_vs_local(rs, local))])  # fmt: skip
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
        rows = [[f"{c} cores"] + [n(proj.get(f"rps_{c}_cores_{s}")) for s in (size, 10 * size)] for c in (2, 4, 16)]
        out += table(["cluster", f"records/s at {size:,}-record epochs", f"at {10 * size:,}-record epochs"], rows)
    return out


def cluster_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    from bench.sections.cluster import CORES, LOCAL

    runs = (results.get("cluster") or {}).get("runs") or []
    local = [r for r in runs if r["where"] == LOCAL]
    rows = []
    for cores in CORES:
        rs = [r for r in runs if r["where"] != LOCAL and r["cores"] == cores]
        if not rs:
            continue
        epoch = summarize([r["epoch_s"]["median"] for r in rs]).median
        base_epoch = summarize([r["epoch_s"]["median"] for r in local]).median
        rows.append(
            target(
                f"standalone cluster, {cores} executor core(s) vs local[2] (stateless, exactly-once)",
                f"{rate_text(rs, 'rps_steady', 'rec/s over epochs')}, median epoch {epoch:.2f} s",
                f"local[2]: {rate_text(local, 'rps_steady', 'rec/s over epochs')}, median epoch {base_epoch:.2f} s",
                ratio(_vs_local(rs, local)),
                "report (scale-out)",
                "reported",
            )
        )
    return rows

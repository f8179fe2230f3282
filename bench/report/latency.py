"""Sections 2, 9 and 10: produce-to-visible latency per trigger, the fixed cost of an almost empty
epoch, and skew (one hot partition); with their targets."""

from __future__ import annotations

import math
from typing import Any

from bench.report.tables import cpu_cell, cpu_text, n, rate_text, ratio, span, span_of, table, target, titled
from bench.runs import ALO, BUILTIN, EO, OURS
from bench.sections.peers import KSTREAMS
from bench.stats import paired_ratio, ratio_summary, summarize, verdict

MODES = ((EO, ALO), (ALO, BUILTIN), (BUILTIN, None), (KSTREAMS, None))  # (mode, its baseline in the table)
KSTREAMS_TEXT = [
    f"{KSTREAMS} (bench/peers: the same pipeline with Kafka Streams' default commit.interval.ms of 100 ms, two",
    "stream threads as in section 8) runs with the 100 ms trigger's rows, on the same broker and input shape, its",
    "stream threads running before the probe's first record. There it is exactly-once's baseline: target p99 ≤ 300",
    "ms and no worse than Kafka Streams' p99 (paired by run).",
]


def latency_limit(trigger: str) -> float:
    """The exactly-once p99 target at `trigger`, in seconds: the trigger + 1 s; at 100 ms or less,
    300 ms (about what Kafka Streams' users see at its default commit interval under exactly_once_v2)."""
    from eos.config import parse_duration

    seconds = parse_duration(trigger)
    return 0.3 if seconds <= 0.1 else seconds + 1.0


def _by_trigger(section: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The runs by trigger (in the order they ran), then by mode."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in section["runs"]:
        by.setdefault(row["trigger"], {}).setdefault(row["mode"], []).append(row)
    return by


def _p99s(rows: list[dict[str, Any]]) -> list[Any]:
    return [r.get("p99_s") for r in rows]


def _vs(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> Any:
    """p99 over the baseline's p99, run by run (runs alternate their order: run i of each is paired)."""
    return ratio_summary(_p99s(rows), _p99s(base))


@titled("latency", "2. Latency")
def latency(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    by_trigger = _by_trigger(section)
    peer = any(KSTREAMS in by_mode for by_mode in by_trigger.values())
    out = [
        f"Produce time (the generator's clock when it calls `produce()`; `linger.ms=5`) to visible to an "
        f"`isolation.level=read_committed` consumer of the output, for every record produced during "
        f"{section['measure_s']:.0f} s after a {section['warmup_s']:.0f} s warm-up, at {section['rate']:,} records/s; "
        "stateless pipeline, processing-time trigger. Baselines: the same pipeline in eos at-least-once mode (records",
        "are visible as soon as they are produced) and on Spark's built-in connector. Median over runs of each run's",
        "percentile. The target applies to exactly-once; the other rows show it for comparison.",
        *(KSTREAMS_TEXT if peer else []),
        *_warm_up_text(section.get("warm_ups") or []),
        "",
    ]
    rows = []
    for trigger, by_mode in by_trigger.items():
        limit = latency_limit(trigger)
        for mode, base_mode in MODES:
            rs = by_mode.get(mode, [])
            if not rs:
                continue
            against_peer = mode == EO and KSTREAMS in by_mode  # the target is Kafka Streams' p99 too
            base_mode = KSTREAMS if against_peer else base_mode
            base_rows = by_mode.get(base_mode, []) if base_mode else []
            p99, vs = summarize(_p99s(rs)), _vs(rs, base_rows)
            met = p99.median <= limit and (not against_peer or vs.median <= 1.0)
            missing = sum(r.get("missing", 0) for r in rs)
            epoch = summarize([_epoch_median(r) for r in rs]).median
            rows.append(
                [
                    trigger,
                    mode,
                    span_of(rs, "p50_s", 2, " s"),
                    span(p99, 2, " s"),
                    n(summarize([r.get("max_s") for r in rs]).median, 2) + " s",
                    f"{sum(r.get('visible', 0) for r in rs):,}" + (f" ({missing} missing)" if missing else ""),
                    cpu_cell(rs),
                    "–" if math.isnan(epoch) else f"{n(epoch, 2)} s",
                    f"{base_mode} p99" if base_rows else "–",
                    ratio(vs) if base_rows else "–",
                    f"≤ {limit:g} s" + (", ≤ 1.00×" if against_peer else ""),
                    "met" if met else "MISSED",
                ]
            )
    return out + table(
        [
            "trigger", "mode", "p50", "p99", "max", "records", "CPU µs/record (incl. the probe)", "median epoch",
            "baseline", "ratio (p99)", "target (p99)", "verdict",
        ],
        rows,
    )  # fmt: skip


def _warm_up_text(warm_ups: list[dict[str, Any]]) -> list[str]:
    """The discarded first run of each Spark configuration (bench.sections.latency says why)."""
    if not warm_ups:
        return []
    seen = "; ".join(f"{w['mode']} p99 {n(w.get('p99_s'), 2)} s" for w in warm_ups)
    return [
        f"Before the measured runs, each Spark configuration ran once at the {warm_ups[0]['trigger']} trigger, "
        f"discarded, so Spark's planner is compiled by the JIT as in a pipeline that has run a while ({seen})."
    ]


def _epoch_median(row: dict[str, Any]) -> float | None:
    epochs = [e["trigger_s"] for e in row.get("epochs", []) if e.get("trigger_s")]
    return summarize(epochs).median if epochs else None


def latency_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("latency") or {}
    if not section.get("runs"):
        return []
    rows = []
    for trigger, by_mode in _by_trigger(section).items():
        eo, alo, peer = by_mode.get(EO, []), by_mode.get(ALO, []), by_mode.get(KSTREAMS, [])
        p99, limit = summarize(_p99s(eo)).median, latency_limit(trigger)
        rows.append(
            target(f"latency p99, trigger {trigger}", f"p99 {p99:.2f} s{cpu_text(eo)}",
                   f"at-least-once p99 {summarize(_p99s(alo)).median:.2f} s", ratio(_vs(eo, alo)), f"≤ {limit:g} s",
                   verdict(p99, limit, higher_is_better=False))
        )  # fmt: skip
        if peer:
            vs = _vs(eo, peer)
            rows.append(
                target(f"latency p99, trigger {trigger}: exactly-once vs {KSTREAMS} (commit.interval.ms=100)",
                       f"p99 {p99:.2f} s{cpu_text(eo)}", f"{KSTREAMS} p99 {summarize(_p99s(peer)).median:.2f} s"
                       f"{cpu_text(peer)}", ratio(vs), "≤ 1.00×", verdict(vs.median, 1.0, higher_is_better=False))
            )  # fmt: skip
    return rows


PIPELINE_CPU = tuple(k for k in OURS if k != "tools")  # every process of ours but the probe


def _pipeline_cpu_per_record(rows: list[dict[str, Any]]) -> float:
    """Median over runs of the pipeline's CPU (µs) per produced record, the probe's own left out."""
    values = [
        sum((r.get("cpu") or {}).get(k, 0.0) for k in PIPELINE_CPU) * 1e6 / r["produced"]
        for r in rows
        if r.get("produced") and r.get("cpu")
    ]
    return summarize(values).median


def trigger_throughput_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    """Issue 38: throughput at a 100 ms trigger ≥ 0.8× at 1 s. Both latency runs carry the same input
    rate and the pipeline keeps up with it at both, so what a smaller trigger costs is CPU per record:
    on a fixed number of cores, throughput per core at a trigger is the inverse of its CPU per record.
    The ratio is CPU per record at 1 s over CPU per record at 100 ms (exactly-once, medians)."""
    section = results.get("latency") or {}
    if not section.get("runs"):
        return []
    by_trigger = _by_trigger(section)
    small, large = by_trigger.get("100ms", {}).get(EO), by_trigger.get("1s", {}).get(EO)
    if not small or not large:
        return []
    cpu_small, cpu_large = _pipeline_cpu_per_record(small), _pipeline_cpu_per_record(large)
    if math.isnan(cpu_small) or math.isnan(cpu_large):
        return []
    share = cpu_large / cpu_small
    return [
        target(
            "throughput per core at a 100 ms trigger vs at 1 s (exactly-once, the same input rate: "
            "CPU per record at 1 s over at 100 ms)",
            f"{cpu_small:,.0f} µs CPU/record at 100 ms",
            f"{cpu_large:,.0f} µs at 1 s",
            f"{share:.2f}×",
            "≥ 0.80×",
            verdict(share, 0.8),
        )
    ]


# The fixed cost per epoch's rows: (key in each run's per_epoch, label)
EPOCH_COST_ROWS = (
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
)


def _per_epoch(rows: list[dict[str, Any]], key: str, factor: float = 1.0) -> list[Any]:
    values = [r["per_epoch"].get(key) for r in rows]
    return [None if v is None else v * factor for v in values]


@titled("epochcost", "9. Fixed cost per epoch")
def epochcost(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    from bench.sections.epochcost import SKIP_FIRST

    out = [
        f"The stateless pipeline over a {section['input']['partitions']}-partition input in epochs of "
        f"{section['epoch_records']} records (`max_records_per_epoch`), available-now: what an epoch costs when it",
        f"carries almost nothing. Epochs {SKIP_FIRST} and later (query start-up excluded); medians per epoch in ms,",
        "median over runs. Spark's built-in connector on the same input and epoch size is Spark's own floor:",
        "a micro-batch with no protocol at all (its CPU per epoch is not measured: —). Targets: exactly-once",
        "median epoch ≤ 250 ms, and ≤ 50 ms (below Spark's floor: docs/EXACTLY_ONCE.md, \"The fixed cost of an",
        'epoch").',
        "",
    ]
    runs = section["runs"]
    configs = [c for c in (EO, ALO, BUILTIN) if runs.get(c)]
    rows = []
    for key, label in EPOCH_COST_ROWS:
        factor = 1 if key == "cpu_ms_per_epoch" else 1000
        rows.append([label] + [_cell(summarize(_per_epoch(runs[c], key, factor))) for c in configs])
    epochs = [span(summarize(_per_epoch(runs[c], "epochs"))) for c in configs]
    rows.append(["epochs measured per run", *epochs])
    return out + table(["per epoch (ms)", *configs], rows)


def _cell(summary: Any) -> str:
    return "—" if not summary.n else span(summary, 0)


def epochcost_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("epochcost") or {}
    runs = section.get("runs") or {}
    if not runs.get(EO):
        return []
    eo, alo = _per_epoch(runs[EO], "trigger_s"), _per_epoch(runs.get(ALO, []), "trigger_s")
    median = summarize(eo).median
    cpu = summarize(_per_epoch(runs[EO], "cpu_ms_per_epoch")).median
    rows = [
        target(
            f"fixed cost per epoch ({section['epoch_records']}-record epochs, exactly-once)",
            f"median epoch {median * 1000:,.0f} ms, {cpu:,.0f} ms CPU/epoch",
            f"at-least-once {summarize(alo).median * 1000:,.0f} ms",
            ratio(ratio_summary(eo, alo)),
            "≤ 0.25 s",
            verdict(median, 0.25, higher_is_better=False),
        )
    ]
    builtin = _per_epoch(runs.get(BUILTIN, []), "trigger_s")
    if summarize(builtin).n:
        rows.append(
            target(
                "fixed cost per epoch, exactly-once vs Spark's built-in connector (Spark's floor)",
                f"median epoch {median * 1000:,.0f} ms",
                f"{BUILTIN} {summarize(builtin).median * 1000:,.0f} ms",
                ratio(ratio_summary(eo, builtin)),
                "≤ 50 ms",
                verdict(median, 0.05, higher_is_better=False),
            )
        )
    return rows


@titled("skew", "10. Skew: one hot partition")
def skew(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    hot = section["hot"]
    tp = section["throughput"]
    out = [
        f"Partition 0 at {hot}× the rate (or the records) of each other partition. Throughput: the stateless",
        "pipeline, exactly-once, available-now, on a uniform and a skewed input of the same events. Latency: the",
        f"probe at the {section['trigger']} trigger, uniform ({section['rate_per_partition']} rec/s per partition) and "
        f"skewed (partition 0 at {hot}× that, the others unchanged).",
        "",
    ]
    rows = []
    for label in ("uniform", "skewed"):
        rs = tp.get(label, [])
        rows.append([label, span_of(rs, "rps_wall"), cpu_cell(rs), span_of(rs, "records_out")])
    out += table(["input", "records/s (wall)", "CPU µs/record", "records out"], rows)
    out += [f"Skewed / uniform throughput (paired): **{ratio(paired_ratio(tp, 'skewed', 'uniform'))}**.", ""]
    rows = []
    for label in ("uniform", "skewed"):
        rs = section["latency"].get(label, [])
        seen = f"{sum(r.get('visible') or 0 for r in rs):,} of {sum(r.get('expected') or 0 for r in rs):,}"
        rows.append([label, *(span_of(rs, k, 2, " s") for k in ("p50_s", "p99_s", "cold_p99_s", "hot_p99_s")),
                     seen, cpu_cell(rs)])  # fmt: skip
    return out + table(["run", "p50", "p99", "p99 cold partitions", "p99 hot partition", "seen", "CPU µs/record"], rows)


def skew_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("skew") or {}
    if not section.get("throughput"):
        return []
    tp = section["throughput"]
    s = paired_ratio(tp, "skewed", "uniform")
    rows = [
        target(f"skew, throughput: one partition at {section['hot']}× vs uniform", rate_text(tp.get("skewed", [])),
               f"uniform: {rate_text(tp.get('uniform', []))}", ratio(s), "≥ 0.9×", verdict(s.median, 0.9))
    ]  # fmt: skip
    lat = section.get("latency") or {}
    cold = [r.get("cold_p99_s") for r in lat.get("skewed", [])]
    uniform = _p99s(lat.get("uniform", []))
    if cold and uniform:
        s = ratio_summary(cold, uniform)
        rows.append(
            target(f"skew, latency: p99 of the cold partitions, trigger {section['trigger']}",
                   f"p99 {summarize(cold).median:.2f} s{cpu_text(lat.get('skewed', []))}",
                   f"uniform p99 {summarize(uniform).median:.2f} s", ratio(s), "≤ 1.2×",
                   verdict(s.median, 1.2, higher_is_better=False))
        )  # fmt: skip
    return rows

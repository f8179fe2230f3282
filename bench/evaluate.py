"""The issue's targets, evaluated on the results: one row each, with its baseline and ratio."""

from __future__ import annotations

from typing import Any

from bench.runs import ALO, BUILTIN, EO, RAW
from bench.stats import by_round, line_fit, ratio_summary, summarize, verdict

MEMORY_SERIES = (
    ("driver (eos, Python) RSS", "driver", "rss_sum_mib"),
    # The largest: the JVM forks to start Spark's Python daemon and other helpers, and for the
    # moment before the exec the child is a second "JVM" sharing its pages (a sum read 1,630 MiB
    # once among samples of 760-990).
    ("Spark JVM RSS (largest process)", "spark_jvm", "rss_max_mib"),
    ("Spark JVM live heap (after a full GC)", "spark_heap", "live_mib"),
    ("Spark JVM outside the heap (RSS - resident heap)", "spark_heap", "outside_heap_mib"),
    ("Python workers PSS (sum)", "python_workers", "pss_sum_mib"),
    ("Python workers RSS (largest)", "python_workers", "rss_max_mib"),
)
# With the heap rows measured, the JVM's RSS is reported without a verdict: G1 touches more of its
# heap towards the cap as it goes, so RSS grows without a leak; a leak shows in one of the two rows.
RSS_SPLIT = {"spark_jvm": "spark_heap"}
FLAT = 1.10


def _fmt_ratio(s: Any) -> str:
    s = s.to_dict() if hasattr(s, "to_dict") else s
    if not s.get("n"):
        return "–"
    return f"{s['median']:.2f}×" + (f" [{s['low']:.2f}–{s['high']:.2f}]" if s["n"] > 1 else "")


def paired_ratio(runs: dict[str, list[dict[str, Any]]], config: str, base: str, key: str = "rps_wall") -> Any:
    """`key` of `config` over `base`, round by round."""
    pairs = by_round(runs.get(config, []), runs.get(base, []))
    return ratio_summary([a.get(key) for a, _ in pairs], [b.get(key) for _, b in pairs])


def _cpu(rows: list[dict[str, Any]]) -> str:
    cpu = summarize([r.get("cpu_us_per_record") for r in rows])
    return f", {cpu.median:,.1f} µs CPU/rec" if cpu.n else ""


def _rate(rows: list[dict[str, Any]], key: str = "rps_wall", unit: str = "rec/s") -> str:
    s = summarize([r.get(key) for r in rows])
    spread = f" [{s.low:,.0f}–{s.high:,.0f}]" if s.n > 1 else ""
    return f"{s.median:,.0f}{spread} {unit}{_cpu(rows)}"


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    section = results.get("throughput") or {}
    for pipeline, data in (section.get("pipelines") or {}).items():
        runs = data["runs"]
        for base, target, label in (
            (BUILTIN, 1.0, "Spark built-in Kafka (same transforms)"),
            (ALO, 0.95, "eos at-least-once"),
            (RAW, 0.5, "raw confluent-kafka loop"),
        ):
            s = paired_ratio(runs, EO, base)
            rows.append(
                {
                    "name": f"throughput, {pipeline}: exactly-once vs {label}",
                    "measured": _rate(runs.get(EO, [])),
                    "baseline": f"{base}: {_rate(runs.get(base, []))}",
                    "value": _fmt_ratio(s),
                    "target": f"≥ {target}×",
                    "verdict": verdict(s.median, target),
                }
            )
    rows += peer_targets(results)
    latency = results.get("latency") or {}
    if latency.get("runs"):
        from eos.config import parse_duration

        for trigger in dict.fromkeys(r["trigger"] for r in latency["runs"]):
            eo = [r for r in latency["runs"] if r["trigger"] == trigger and r["mode"] == EO]
            alo = [r for r in latency["runs"] if r["trigger"] == trigger and r["mode"] == ALO]
            p99 = summarize([r.get("p99_s") for r in eo]).median
            limit = parse_duration(trigger) + 1.0
            rows.append(
                {
                    "name": f"latency p99, trigger {trigger}",
                    "measured": f"p99 {p99:.2f} s{_cpu(eo)}",
                    "baseline": f"at-least-once p99 {summarize([r.get('p99_s') for r in alo]).median:.2f} s",
                    "value": _fmt_ratio(ratio_summary([r.get("p99_s") for r in eo], [r.get("p99_s") for r in alo])),
                    "target": f"≤ {limit:g} s",
                    "verdict": verdict(p99, limit, higher_is_better=False),
                }
            )
    rows += epoch_cost_targets(results)
    rows += skew_targets(results)
    rows += postgres_targets(results)
    rows += cluster_targets(results)
    recovery = results.get("recovery") or {}
    for point in dict.fromkeys(r["point"] for r in recovery.get("runs", [])):
        rs = [r for r in recovery["runs"] if r["point"] == point]
        restart = summarize([r["restart_to_first_commit_s"] for r in rs]).median
        ok = all(r["exactly_once"] for r in rs)
        rows.append(
            {
                "name": f"recovery after kill -9 at `{point}`",
                "measured": f"{restart:.1f} s to the first committed epoch" + ("" if ok else " (OUTPUT WRONG)"),
                "baseline": f"cold start {summarize([r['cold_start_to_first_commit_s'] for r in rs]).median:.1f} s",
                "value": _fmt_ratio(
                    ratio_summary(
                        [r["restart_to_first_commit_s"] for r in rs], [r["cold_start_to_first_commit_s"] for r in rs]
                    )
                ),
                "target": "≤ 30 s",
                "verdict": verdict(restart, 30, higher_is_better=False) if ok else "MISSED",
            }
        )
    memory = results.get("memory") or {}
    if memory.get("samples"):
        for v in memory_verdicts(memory):
            rows.append(
                {
                    "name": f"memory flat: {v['what']}",
                    "measured": f"peak {v['peak']:,.0f} MiB (last third)",
                    "baseline": f"peak {v['baseline']:,.0f} MiB (first third)",
                    "value": f"{v['ratio']:.2f}×",
                    "target": v["target"],
                    "verdict": v["verdict"],
                }
            )
    fp = results.get("failpoints") or {}
    if fp.get("ratio"):
        band, within = noise_band(fp)
        rows.append(
            {
                "name": "failpoints disarmed vs compiled out (sink slot path)",
                "measured": f"{fp['hit_ns']} ns per hit()",
                "baseline": "hit() replaced by a no-op",
                "value": _fmt_ratio(fp["ratio"]),
                "target": f"within A/A noise, 1 ± {band:.3f}",
                "verdict": "met" if within else "MISSED",
            }
        )
    return rows


def memory_verdicts(section: dict[str, Any]) -> list[dict[str, Any]]:
    samples = section["samples"]
    duration = section["duration_s"]
    steady = [s for s in samples if s["t_s"] >= 0.2 * duration]
    if len(steady) < 3:
        return []
    start, end = steady[0]["t_s"], steady[-1]["t_s"]
    third = (end - start) / 3
    out = []
    for what, cls, metric in MEMORY_SERIES:
        series = [(s["t_s"], s[cls][metric], s[cls]["processes"]) for s in steady if cls in s]
        if len(series) < 3:
            continue
        first = [v for t, v, _ in series if t <= start + third]
        last = [v for t, v, _ in series if t >= end - third]
        _, slope, _ = line_fit([t / 60 for t, _, _ in series], [v for _, v, _ in series])
        ratio = max(last) / max(first) if first and last and max(first) else float("nan")
        split = cls in RSS_SPLIT and any(RSS_SPLIT[cls] in s for s in steady)
        out.append(
            {
                "what": what,
                "baseline": max(first),
                "peak": max(last),
                "ratio": ratio,
                "slope": slope,
                "processes": f"{min(p for _, _, p in series)}–{max(p for _, _, p in series)}",
                "verdict": "reported" if split else verdict(ratio, FLAT, higher_is_better=False),
                "target": "reported (the heap rows judge)" if split else f"≤ {FLAT:.2f}×",
            }
        )
    return out


def noise_band(fp: dict[str, Any]) -> tuple[float, bool]:
    """How far from 1 the A/A ratios (disarmed vs disarmed) strayed, and whether the
    disarmed/compiled-out median stays that close to 1."""
    noise = fp["noise_ratio"]
    band = max(abs(noise["low"] - 1), abs(noise["high"] - 1))
    return band, abs(fp["ratio"]["median"] - 1) <= band


def peer_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    from bench.sections.peers import KSTREAMS, QUIX

    rows = []
    for pipeline, data in ((results.get("peers") or {}).get("pipelines") or {}).items():
        runs = data["runs"]
        where = f"{pipeline}, {data['input']['partitions']} partition(s)"
        for base, target in ((QUIX, 1.0), (KSTREAMS, None)):
            s = paired_ratio(runs, EO, base)
            rows.append(
                {
                    "name": f"throughput, {where}: exactly-once vs {base}",
                    "measured": _rate(runs.get(EO, [])),
                    "baseline": f"{base}: {_rate(runs.get(base, []))} (processing time)",
                    "value": _fmt_ratio(s),
                    "target": f"≥ {target}×" if target else "report the ratio",
                    "verdict": verdict(s.median, target) if target else "reported",
                }
            )
    return rows


def epoch_cost_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("epochcost") or {}
    runs = section.get("runs") or {}
    if not runs.get(EO):
        return []
    eo = summarize([r["per_epoch"].get("trigger_s") for r in runs[EO]])
    alo = summarize([r["per_epoch"].get("trigger_s") for r in runs.get(ALO, [])])
    s = ratio_summary(
        [r["per_epoch"].get("trigger_s") for r in runs[EO]],
        [r["per_epoch"].get("trigger_s") for r in runs.get(ALO, [])],
    )
    cpu = summarize([r["per_epoch"].get("cpu_ms_per_epoch") for r in runs[EO]])
    return [
        {
            "name": f"fixed cost per epoch ({section['epoch_records']}-record epochs, exactly-once)",
            "measured": f"median epoch {eo.median * 1000:,.0f} ms, {cpu.median:,.0f} ms CPU/epoch",
            "baseline": f"at-least-once {alo.median * 1000:,.0f} ms",
            "value": _fmt_ratio(s),
            "target": "≤ 0.25 s",
            "verdict": verdict(eo.median, 0.25, higher_is_better=False),
        }
    ]


def skew_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("skew") or {}
    if not section.get("throughput"):
        return []
    rows = []
    tp = section["throughput"]
    s = paired_ratio({"s": tp.get("skewed", []), "u": tp.get("uniform", [])}, "s", "u")
    rows.append(
        {
            "name": f"skew, throughput: one partition at {section['hot']}× vs uniform",
            "measured": _rate(tp.get("skewed", [])),
            "baseline": f"uniform: {_rate(tp.get('uniform', []))}",
            "value": _fmt_ratio(s),
            "target": "≥ 0.9×",
            "verdict": verdict(s.median, 0.9),
        }
    )
    lat = section.get("latency") or {}
    cold = [r.get("cold_p99_s") for r in lat.get("skewed", [])]
    uniform = [r.get("p99_s") for r in lat.get("uniform", [])]
    if cold and uniform:
        s = ratio_summary(cold, uniform)
        rows.append(
            {
                "name": f"skew, latency: p99 of the cold partitions, trigger {section['trigger']}",
                "measured": f"p99 {summarize(cold).median:.2f} s{_cpu(lat.get('skewed', []))}",
                "baseline": f"uniform p99 {summarize(uniform).median:.2f} s",
                "value": _fmt_ratio(s),
                "target": "≤ 1.2×",
                "verdict": verdict(s.median, 1.2, higher_is_better=False),
            }
        )
    return rows


def postgres_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    section = results.get("postgres") or {}
    runs = section.get("runs") or {}
    if not runs.get("eos"):
        return []
    s = paired_ratio(runs, "eos", "copy", key="rows_per_s")
    return [
        {
            "name": "PostgreSQL sink (exactly-once) vs a psycopg COPY loop",
            "measured": _rate(runs["eos"], "rows_per_s", "rows/s"),
            "baseline": f"COPY loop: {_rate(runs.get('copy', []), 'rows_per_s', 'rows/s')}",
            "value": _fmt_ratio(s),
            "target": "report the ratio",
            "verdict": "reported",
        }
    ]


def cluster_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    from bench.sections.cluster import CORES, LOCAL

    section = results.get("cluster") or {}
    runs = section.get("runs") or []
    if not runs:
        return []
    local = [r for r in runs if r["where"] == LOCAL]
    rows = []
    for cores in CORES:
        rs = [r for r in runs if r["where"] != LOCAL and r["cores"] == cores]
        if not rs:
            continue
        paired = by_round(rs, local)
        s = ratio_summary([a["rps_steady"] for a, _ in paired], [b["rps_steady"] for _, b in paired])
        epoch = summarize([r["epoch_s"]["median"] for r in rs])
        base_epoch = summarize([r["epoch_s"]["median"] for r in local])
        rows.append(
            {
                "name": f"standalone cluster, {cores} executor core(s) vs local[2] (stateless, exactly-once)",
                "measured": f"{_rate(rs, 'rps_steady', 'rec/s over epochs')}, median epoch {epoch.median:.2f} s",
                "baseline": f"local[2]: {_rate(local, 'rps_steady', 'rec/s over epochs')}, median epoch "
                f"{base_epoch.median:.2f} s",
                "value": _fmt_ratio(s),
                "target": "report (scale-out)",
                "verdict": "reported",
            }
        )
    return rows

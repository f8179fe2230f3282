"""The same pipelines on Spark's built-in Kafka source and sink (spark-sql-kafka-0-10): what a
PySpark user would otherwise pick. At-least-once only (Spark's Kafka sink has no transactions).

The transform code is eos's own, so the comparison is about the connectors and the protocol,
not about the Avro codec: the same fastavro code decodes and encodes (eos_connectors.formats.avro's
`decode_batch`/`encode_batch`, here as `arrow_udf`s, the decode evaluated once per record; spark-avro
is not used), the same SQL and the same Python transform run, the sink's columns are built by
eos's own `sink_columns`, and the source reads `read_committed` like eos's. What differs is only
what a connector does: Spark reads with its Kafka consumer in the JVM and the rows go to a Python
worker for the decode UDF and again for the encode UDF, then Kafka's Java producer writes them
from the JVM; eos reads and decodes in one Python read task and encodes and produces in the sink
writer, in the same stage.
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
from eos.api import ERROR, POISON_COLUMNS, RAW_KEY, RAW_VALUE
from eos.config import pipeline_from_yaml
from eos.declared import load_function
from eos.yamlsource import parse_yaml
from eos_connectors.formats.avro import decode_codec, decode_udf, encode_codec, encode_with
from eos_connectors.formats.decode import METADATA, decode_in_spark, source_view
from eos_connectors.formats.encode import sink_columns


@dataclass
class BuiltinRun:
    wall_s: float
    epochs: list[dict[str, Any]]
    cpu: dict[str, float]
    spans: dict[str, float]

    @property
    def epoch_time_s(self) -> float:
        return sum(e["trigger_s"] for e in self.epochs)


def _decode_once(codec: Any, column: Any) -> Any:
    """eos's Avro decode UDF (eos_connectors.formats.avro's `decode_udf`), marked nondeterministic
    so that Spark evaluates it once per record. A deterministic UDF lets the optimizer push the
    filters on its result (the poison check, the SQL's WHERE) below the projection, and the plan
    then decodes every record twice, once for the filter and once for the columns (seen in the
    physical plan: two ArrowEvalPython nodes of decode_avro). A PySpark user tuning this pipeline
    would do the same, so the baseline does."""
    return decode_udf(codec).asNondeterministic()(column)


def decoded_rows(raw, source, base_dir: Path):
    """Spark's Kafka rows -> eos's source rows (key, value, metadata, poison columns), the Avro
    decoded by the same fastavro code eos's read task runs, as a UDF."""
    from pyspark.sql import functions as F

    columns = {"key": F.col("key"), "value": F.col("value")}
    errors = []
    decoded = []  # each UDF result in a column of its own, referenced (not repeated) after
    for which, fmt in (("key", source.key_format), ("value", source.value_format)):
        if fmt.type == "avro":
            result = _decode_once(decode_codec(fmt, which, base_dir, list(source.kafka.topics)), F.col(which))
            decoded.append(result.alias(f"_decoded_{which}"))
            columns[which] = F.col(f"_decoded_{which}.value")
            errors.append(F.col(f"_decoded_{which}.error"))
    raw = raw.select("*", *decoded)
    error = F.coalesce(*errors) if errors else F.lit(None).cast("string")
    if source.on_error == "fail":  # eos's read task stops at the first poison record: one check
        error = F.when(error.isNotNull(), F.raise_error(F.concat(F.lit("poison record: "), error)))
    return source_rows(raw, columns["key"], columns["value"], error, source, base_dir)


def source_rows(raw, key, value, error, source, base_dir: Path | None):
    """Spark's Kafka rows with `key` and `value` decoded (or not) and `error` -> the rows eos's
    reader gives: metadata, poison columns (no raw bytes kept), then string keys and json values
    by the same Spark expressions eos applies to its reader's rows."""
    from pyspark.sql import functions as F

    rows = raw.select(
        key.alias("key"),
        value.alias("value"),
        *METADATA,
        error.alias(ERROR),
        F.lit(None).cast("binary").alias(RAW_KEY),
        F.lit(None).cast("binary").alias(RAW_VALUE),
    )
    return decode_in_spark(rows, source, base_dir)


def _plan(session, config, base_dir: Path, bootstrap: str, epoch_records: int | None):
    """config (an eos pipeline, parsed) -> the streaming (key, value) DataFrame of its one sink."""
    from pyspark.sql import functions as F

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
    decoded = decoded_rows(reader.load(), source, base_dir)
    view = source_view(decoded, source).filter(F.col(ERROR).isNull()).drop(*POISON_COLUMNS)
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
    rows = sink_columns(session.table(config.sink_input(sink)), sink, base_dir)
    key, value = F.col("key"), F.col("value")
    if sink.key_format.type == "avro":
        key = encode_with(encode_codec(sink.key_format, "key", base_dir, sink.kafka.topic), key)
    if sink.value_format.type == "avro":
        value = encode_with(encode_codec(sink.value_format, "value", base_dir, sink.kafka.topic), value)
    return rows.select(key.alias("key"), value.alias("value"))


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
        # The same batching as eos's sink producers (eos_connectors.kafka.sink.PRODUCER_BATCHING).
        .option("kafka.linger.ms", "5")
        .option("kafka.batch.size", "1000000")
        .option("kafka.compression.type", "lz4")
        # Spark keeps the producer for 10 minutes after a run, and the bench deletes the run's
        # output topic: without this the producer asks for the deleted topic's metadata, with a
        # WARN line, about once a second for 5 minutes (its default). It never idles in a run.
        .option("kafka.metadata.max.idle.ms", "5000")
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

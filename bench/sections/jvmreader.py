"""16. Reading Kafka in the JVM: eos exactly-once with Spark's own Kafka reader, against eos's.

An experiment (issue 38, part 4), not a product feature. eos's Kafka source reads in Python
(eos_connectors.kafka.reader: a Python data source whose read tasks fetch with confluent-kafka and
decode the Avro records with fastavro in the same task). Spark's Kafka reader (spark-sql-kafka-0-10)
fetches in the JVM, and its offset log holds the same thing eos's barrier needs: every partition's
end offset, logged before the epoch is processed, and replayed as logged. So this section runs the
stateless pipeline with the same protocol, sink, SQL and Avro code, and only the reader swapped:
the `kafka:` source's connector is, for these runs, one whose stream is Spark's Kafka reader
(`SparkReadSource`), with the Avro decode as the Python UDF the built-in baseline uses
(bench.builtin.decoded_rows), and, in a third configuration, decoded in the JVM by spark-avro's
`from_avro`. Rounds rotate the order, on the throughput section's input and epoch size; throughput and
CPU per record.

With the UDF the records cross into Python once more (JVM fetch -> Python decode -> JVM -> Python
sink writer) than with eos's reader (Python fetch and decode -> JVM -> Python sink writer); with
spark-avro they do not (JVM fetch and decode -> Python sink writer). What it cannot show: a JVM
reader as eos would ship it, with eos's poison routing (these support `on_error: fail` only),
registry-framed Avro, secured brokers and the reader's checks (a recreated topic, a broker that
restarts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from bench.builtin import decoded_rows, source_rows
from bench.context import Bench
from bench.runs import EO, brief, measure, warm_up
from bench.stats import summarize
from eos import registry
from eos.protocol.source import StreamOptions
from eos_connectors.formats.avro_schema import load_avsc
from eos_connectors.formats.decode import source_view
from eos_connectors.kafka.source import KafkaSource

JVM = "eos exactly-once, Spark's Kafka reader, Avro in a Python UDF"
JVM_AVRO = "eos exactly-once, Spark's Kafka reader, Avro in the JVM (spark-avro)"
CONFIGS = (EO, JVM, JVM_AVRO)


class SparkReadSource(KafkaSource):
    """eos's Kafka source whose records Spark's Kafka reader fetches (plaintext brokers only).
    Its poison scan is eos's own, which under `on_error: fail` plans no read task (a `false`
    filter over Spark's reader is not pruned in a streaming query: its tasks read every record
    again and drop them; measured, 8 slots per epoch instead of 4)."""

    jvm_decode = False  # the Avro value decoded by spark-avro's from_avro, else by eos's fastavro UDF

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._raw: Any = None

    def _scan(self, spark: Any, pinned: dict[str, Any], options: StreamOptions, poison_scan: bool) -> Any:
        if self.entry.on_error != "fail":
            raise ValueError(f"source {self.name}: the Spark-reader experiment supports on_error: fail only")
        if poison_scan:
            return super()._scan(spark, pinned, options, poison_scan)
        if self._raw is None:
            kafka = self.entry.kafka
            reader = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribe", ",".join(kafka.topics))
                .option("startingOffsets", json.dumps(pinned["starting"]))
                .option("includeHeaders", "true")
                .option("failOnDataLoss", "true")
                .option("kafka.isolation.level", kafka.isolation)
            )
            if kafka.max_records_per_epoch:
                reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_records_per_epoch))
            self._raw = reader.load()
        decode = _jvm_decoded if self.jvm_decode else decoded_rows
        return source_view(decode(self._raw, self.entry, self.pipeline.base_dir), self.entry)


class SparkAvroSource(SparkReadSource):
    jvm_decode = True


def _jvm_decoded(raw: Any, entry: Any, base_dir: Any) -> Any:
    """Spark's Kafka rows -> eos's source rows, the (plain Avro) value decoded by spark-avro. A
    record it cannot decode fails the task (FAILFAST), as eos's reader does under `on_error: fail`."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    fmt = entry.value_format
    if fmt.type != "avro" or fmt.registry or entry.key_format.type == "avro":
        raise ValueError(f"source {entry.name}: the spark-avro experiment decodes plain Avro values only")
    schema = json.dumps(load_avsc(fmt.schema_file, base_dir))
    value = from_avro(F.col("value"), schema, {"mode": "FAILFAST"})
    return source_rows(raw, F.col("key"), value, F.lit(None).cast("string"), entry, base_dir)


@contextlib.contextmanager
def spark_reader(source: type[SparkReadSource]) -> Iterator[None]:
    """Inside, a pipeline's `kafka:` sources are `source`s. The registry's table of kinds is
    cached: it is the one every pipeline of this process looks its connectors up in."""
    kinds = registry.connectors()
    original = kinds["kafka"]
    kinds["kafka"] = dataclasses.replace(original, source=source)
    try:
        yield
    finally:
        kinds["kafka"] = original


def _measure(bench: Bench, config: str, source: Any) -> dict[str, Any]:
    readers = {JVM: SparkReadSource, JVM_AVRO: SparkAvroSource}
    with spark_reader(readers[config]) if config in readers else contextlib.nullcontext():
        row = measure(bench, "stateless", EO, source, bench.plan.epoch_records)
    row["config"] = config
    row["slots"] = summarize([e.get("slots") for e in row["epochs"]]).median
    return row


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.events, plan.partitions)
    warm_up(bench, on=source)
    # Twice each: after one warm-up the Spark reader's runs still sped up round after round (its
    # JVM code paths compile later than eos's, which every other section's runs have warmed).
    for config in CONFIGS[1:] * 2:
        bench.say(f"JVM reader: warm-up of {config} on {source.records:,} records (discarded)")
        _measure(bench, config, source)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    rounds = 2 * plan.rounds
    for round_no in range(rounds):
        for config in CONFIGS[round_no % 3 :] + CONFIGS[: round_no % 3]:
            bench.say(f"JVM reader: round {round_no + 1}/{rounds}: {config} ...")
            row = _measure(bench, config, source)
            row["round"] = round_no
            runs[config].append(row)
            bench.say(f"JVM reader: {config}: {brief(row)}")
    return {"input": source.__dict__, "epoch_records": plan.epoch_records, "runs": runs}


def report(results: dict[str, Any]) -> list[str]:
    """The section's part of docs/BENCHMARKS.md."""
    from bench.report.tables import n, opening, ratio, span, table
    from bench.stats import paired_ratio

    section, out = opening(results, "jvmreader", "16. Reading Kafka in the JVM (an experiment)")
    if section is None:
        return out
    runs = section["runs"]
    out += [
        f"The stateless pipeline, exactly-once, on the throughput section's input ({section['input']['records']:,} "
        f"records, epochs of {section['epoch_records']:,}), with eos's Python reader and with Spark's Kafka reader "
        "in its place (same protocol, sink, SQL and Avro code; bench/sections/jvmreader.py says what differs). "
        "Rounds rotate the order; the ratio is paired within a round.",
        "",
    ]
    rows = []
    for config in CONFIGS:
        rs = runs[config]
        rows.append(
            [
                config,
                span(summarize([r["rps_wall"] for r in rs]), 0, " rec/s"),
                n(summarize([r["cpu_us_per_record"] for r in rs]).median, 1),
                n(summarize([r["slots"] for r in rs]).median),
                ratio(paired_ratio(runs, config, EO)) if config != EO else "1.00×",
                ratio(paired_ratio(runs, config, EO, "cpu_us_per_record")) if config != EO else "1.00×",
            ]
        )
    head = ["reader", "throughput", "CPU µs/record", "slots per epoch", "throughput vs eos's reader", "CPU/record vs"]
    out += table(head, rows)
    return [*out, ""]

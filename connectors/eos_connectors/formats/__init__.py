"""Keys and values as bytes on Kafka, as columns in Spark.

Sources: `decode_source` turns the raw Kafka columns into decoded `key` / `value` columns plus
`_eos_error` (why a record could not be decoded, or null) and the raw bytes, so a poison record
can be failed on, skipped, or sent to a dead-letter queue with its original bytes.
Sinks: `encode_sink` turns a view into the rows every sink slot consumes:
(sink, key binary, value binary, headers).

Formats: raw (bytes as they are), string (UTF-8), json (schema from an .avsc file), avro.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from eos.errors import ConfigError
from eos_connectors.formats.avro_schema import load_avsc, record_fields_ddl, spark_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from eos.config import FormatConfig, PipelineConfig, SinkConfig, SourceConfig

ERROR = "_eos_error"
RAW_KEY = "_eos_raw_key"
RAW_VALUE = "_eos_raw_value"
CORRUPT = "_corrupt_record"
POISON_MARKER = "eos poison record"
SINK_HEADERS_TYPE = "array<struct<key: string, value: binary>>"
METADATA = ["topic", "partition", "offset", "timestamp", "headers"]


@contextlib.contextmanager
def _context(where: str) -> Iterator[None]:
    """Say which source or sink (and key or value) a configuration error is about."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}", exc.hint) from None


def check_formats(config: PipelineConfig, base_dir: Path | None = None) -> None:
    """Load and check every schema file the pipeline names, before anything starts (registries
    are asked later, when the plan is built)."""
    from eos_connectors.formats.avro_schema import record_fields_ddl

    formats = [(f"source {s.name}", s.key_format, s.value_format) for s in config.sources]
    formats += [(f"sink {s.name}", s.key_format, s.value_format) for s in config.sinks]
    for owner, *pair in formats:
        for which, fmt in zip(("key_format", "value_format"), pair, strict=True):
            with _context(f"{owner}: {which}"):
                for name in (fmt.schema_file, fmt.reader_schema):
                    if name:
                        schema = load_avsc(name, base_dir)
                        if fmt.type == "json":
                            record_fields_ddl(schema)
                        else:
                            spark_type(schema)


def _decode_column(
    column: Column, fmt: FormatConfig, which: str, base_dir: Path | None, topics: list[str] | None = None
) -> tuple[Column, Column]:
    """(decoded column, error message column or null)."""
    from pyspark.sql import functions as F

    no_error = F.lit(None).cast("string")
    if fmt.type == "raw":
        return column, no_error
    if fmt.type == "string":
        return column.cast("string"), no_error
    if fmt.type == "json":
        schema = load_avsc(fmt.schema_file, base_dir) if fmt.schema_file else None
        if schema is None:
            raise NotImplementedError("json with a schema registry")
        ddl = f"{record_fields_ddl(schema)}, `{CORRUPT}` STRING"
        parsed = F.from_json(column.cast("string"), ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        error = F.when(parsed[CORRUPT].isNotNull(), F.lit(f"{which}: malformed JSON or a field of the wrong type"))
        return parsed.dropFields(CORRUPT), error
    if fmt.type == "avro":
        from eos_connectors.formats import avro

        return avro.decode_column(column, fmt, which, base_dir, topics)
    raise ValueError(f"unknown format {fmt.type}")


def decode_source(raw: DataFrame, source: SourceConfig, base_dir: Path | None = None) -> DataFrame:
    """Raw Kafka columns -> key, value (decoded), metadata, _eos_error, raw key and value."""
    from pyspark.sql import functions as F

    topics = list(source.kafka.topics)
    with _context(f"source {source.name}: key_format"):
        key, key_error = _decode_column(F.col("key"), source.key_format, "key", base_dir, topics)
    with _context(f"source {source.name}: value_format"):
        value, value_error = _decode_column(F.col("value"), source.value_format, "value", base_dir, topics)
    return raw.select(
        key.alias("key"),
        value.alias("value"),
        *METADATA,
        F.coalesce(key_error, value_error).alias(ERROR),
        F.col("key").alias(RAW_KEY),
        F.col("value").alias(RAW_VALUE),
    )


def split_poison(
    view_branch: DataFrame, poison_branch: DataFrame, source: SourceConfig, pipeline: str
) -> tuple[DataFrame, DataFrame]:
    """(good records as the source's view, poison records as sink rows) by on_error.

    Both arguments are the same source, decoded, planned as two Spark sources (two lines in the
    offset log) whatever the policy, so the checkpoint has the same shape under every policy:
    after a `fail` stop the operator can switch the source to `skip` or `dlq` and restart on the
    same checkpoint, and the failed epoch is replayed with its logged offsets. (With one source
    under `fail`, Spark refuses that restart: "There are [1] sources in the checkpoint offsets and
    now there are [2]".) Both branches plan the same end offsets for each epoch
    (eos_connectors.kafka.source PlanBook): the poison branch never gets ahead of the view, so under
    `fail` nothing it skips was left unchecked; and each branch reads every offset once, with complementary
    filters, so every record ends up once in the view or in the poison rows.

    Under `fail` the view branch itself stops the epoch on a poison record, and the poison branch
    reads nothing: the default policy reads each record once. Under `skip` and `dlq` both read."""
    from pyspark.sql import functions as F

    error = F.col(ERROR)
    view_columns = ["key", "value", *METADATA]
    bad = poison_branch.filter(error.isNotNull())
    if source.on_error == "fail":
        where = F.concat(
            F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit(" offset "),
            F.col("offset").cast("string"),
        )  # fmt: skip
        message = F.concat(
            F.lit(f"{POISON_MARKER}: source {source.name}: cannot decode the record at "), where,
            F.lit(": "), error,
            F.lit(" (on_error: fail; use on_error: skip or dlq to route such records instead)"),
        )  # fmt: skip
        # Evaluating a poison record fails its task before the sink stage starts: nothing of the
        # epoch is written, and the epoch fails permanently with this message.
        good = view_branch.filter(F.when(error.isNotNull(), F.raise_error(message)).otherwise(F.lit(True)))
        rows = bad.select(
            F.lit(poison_sink_name(source)).alias("sink"),
            F.col(RAW_KEY).alias("key"),
            F.col(RAW_VALUE).alias("value"),
            F.array().cast(SINK_HEADERS_TYPE).alias("headers"),
        )
        return good.select(*view_columns), rows
    good = view_branch.filter(error.isNull()).select(*view_columns)
    provenance = F.array(
        F.struct(F.lit("eos.error").alias("key"), error.cast("binary").alias("value")),
        F.struct(F.lit("eos.pipeline").alias("key"), F.lit(pipeline).cast("binary").alias("value")),
        F.struct(F.lit("eos.source").alias("key"), F.lit(source.name).cast("binary").alias("value")),
        F.struct(F.lit("eos.topic").alias("key"), F.col("topic").cast("binary").alias("value")),
        F.struct(F.lit("eos.partition").alias("key"), F.col("partition").cast("string").cast("binary").alias("value")),
        F.struct(F.lit("eos.offset").alias("key"), F.col("offset").cast("string").cast("binary").alias("value")),
    )
    rows = bad.select(
        F.lit(poison_sink_name(source)).alias("sink"),
        F.col(RAW_KEY).alias("key"),
        F.col(RAW_VALUE).alias("value"),
        F.concat(F.col("headers"), provenance).cast(SINK_HEADERS_TYPE).alias("headers"),
    )
    return good, rows


def source_view(good: DataFrame, source: SourceConfig) -> DataFrame:
    """The columns SQL sees. Raw and string values keep Spark's Kafka layout (key, value, topic,
    partition, offset, timestamp, headers). A record value (json, avro) is flattened: its fields
    become columns, and the Kafka metadata is named _key, _topic, _partition, _offset, _timestamp,
    _headers so it can never clash with a field."""
    from pyspark.sql import functions as F

    if source.value_format.type not in ("json", "avro"):
        return good
    return good.select("value.*", *[F.col(c).alias(f"_{c}") for c in ["key", *METADATA]])


def poison_sink_name(source: SourceConfig) -> str:
    """The internal sink that takes a source's poison records: its DLQ, or a counter for skip."""
    return f"{source.name}.{'dlq' if source.on_error == 'dlq' else 'skipped'}"


def _encode_column(
    column: Column, fmt: FormatConfig, which: str, base_dir: Path | None, view: DataFrame, sink: SinkConfig
) -> Column:
    from pyspark.sql import functions as F

    if fmt.type == "raw":
        return column.cast("binary")
    if fmt.type == "string":
        return column.cast("string").cast("binary")
    if fmt.type == "json":
        return F.to_json(column).cast("binary")
    if fmt.type == "avro":
        from eos_connectors.formats import avro

        codec = avro.encode_codec(fmt, which, base_dir, sink.kafka.topic)
        data_type = view.select(column).schema.fields[0].dataType
        return avro.encode_with(codec, avro.fit_to_schema(column, data_type, codec, which))
    raise ValueError(f"unknown format {fmt.type}")


def encode_sink(view: DataFrame, sink: SinkConfig, base_dir: Path | None = None) -> DataFrame:
    """A view -> (sink, key, value, headers) rows for the sink slots."""
    from pyspark.sql import functions as F

    if sink.value is not None:
        value = F.expr(sink.value)
    elif sink.value_format.type in ("json", "avro"):
        value = F.struct(*[F.col(f"`{c}`") for c in view.columns])
    elif "value" in view.columns:
        value = F.col("value")
    else:
        raise ValueError(f"sink {sink.name}: say which column is the value (value: ...)")
    with _context(f"sink {sink.name}: key_format"):
        key = F.lit(None)
        if sink.key:
            key = _encode_column(F.expr(sink.key), sink.key_format, "key", base_dir, view, sink)
    with _context(f"sink {sink.name}: value_format"):
        value = _encode_column(value, sink.value_format, "value", base_dir, view, sink)
    headers = F.expr(sink.headers) if sink.headers else F.array()
    return view.select(
        F.lit(sink.name).alias("sink"),
        key.cast("binary").alias("key"),
        value.alias("value"),
        headers.cast(SINK_HEADERS_TYPE).alias("headers"),
    )


__all__ = [
    "check_formats", "decode_source", "encode_sink", "load_avsc", "poison_sink_name", "source_view", "spark_type",
    "split_poison",
]  # fmt: skip

"""A sink's view -> the columns its slot writers get: key, value, headers.

Formats Spark encodes natively (raw, string, json, csv) are encoded here, in the JVM. An Avro key or
value stays a struct shaped exactly as its schema (fields matched by name and cast), and the slot
writer encodes it with fastavro in the same pass that produces it: the rows cross from the JVM
to Python once, instead of once for an encoding UDF and once more for the writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos.api import ConfigError
from eos_connectors.formats.config import FormatConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

SINK_HEADERS_TYPE = "array<struct<key: string, value: binary>>"


def _column(column: Column, fmt: FormatConfig, which: str, base_dir: Path | None, view: DataFrame, topic: str) -> Any:
    from pyspark.sql import functions as F

    if fmt.type == "raw":
        return column.cast("binary")
    if fmt.type == "string":
        return column.cast("string").cast("binary")
    if fmt.type == "json":
        return F.to_json(column).cast("binary")
    if fmt.type == "csv":
        return F.to_csv(column).cast("binary")
    from eos_connectors.formats import avro

    codec = avro.encode_codec(fmt, which, base_dir, topic)
    data_type = view.select(column).schema.fields[0].dataType
    return avro.fit_to_schema(column, data_type, codec, which)


def sink_columns(view: DataFrame, entry: Any, base_dir: Path | None = None) -> DataFrame:
    """`entry`: a Kafka sink entry (key, value, headers expressions and formats)."""
    from pyspark.sql import functions as F

    if entry.value is not None:
        value = F.expr(entry.value)
    elif entry.value_format.type in ("json", "csv", "avro"):
        value = F.struct(*[F.col(f"`{c}`") for c in view.columns])
    elif "value" in view.columns:
        value = F.col("value")
    else:
        raise ConfigError(f"sink {entry.name}: say which column is the value (value: ...)")
    topic = entry.kafka.topic
    try:
        key = F.lit(None).cast("binary")
        if entry.key:
            key = _column(F.expr(entry.key), entry.key_format, "key", base_dir, view, topic)
    except ConfigError as exc:
        raise ConfigError(f"sink {entry.name}: key_format: {exc.message}", exc.hint) from None
    try:
        value = _column(value, entry.value_format, "value", base_dir, view, topic)
    except ConfigError as exc:
        raise ConfigError(f"sink {entry.name}: value_format: {exc.message}", exc.hint) from None
    headers = F.expr(entry.headers) if entry.headers else F.array()
    return view.select(key.alias("key"), value.alias("value"), headers.cast(SINK_HEADERS_TYPE).alias("headers"))

"""A source's rows as the pipeline sees them: decoded keys and values, poison marked.

Avro is decoded in the source's read task (eos_connectors.kafka.reader): the rows reach the JVM
decoded, in one trip. Formats Spark decodes natively are decoded here, in the JVM: `string` is a
cast, `json` and `csv` are `from_json` / `from_csv` with a schema (a Spark DDL string, or an .avsc
file's record), and a value that does not parse is
marked as poison (`_eos_error`, raw bytes kept for a dead-letter queue) like an undecodable Avro
record. Under `on_error: fail` such a record fails its task with a typed error before anything of
the epoch is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos.api import ERROR, POISON_COLUMNS, RAW_KEY, RAW_VALUE, PoisonRecord, to_wire
from eos_connectors.formats.avro_schema import load_avsc, record_fields_ddl
from eos_connectors.formats.config import FormatConfig
from eos_connectors.formats.ddl import is_ddl

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

CORRUPT = "_corrupt_record"
METADATA = ["topic", "partition", "offset", "timestamp", "headers"]


def _decode(column: Column, fmt: FormatConfig, which: str, base_dir: Path | None) -> tuple[Column, Column | None]:
    """(decoded column, error column or None) for a format Spark decodes; Avro is decoded already."""
    from pyspark.sql import functions as F

    if fmt.type in ("raw", "avro"):
        return column, None
    if fmt.type == "string":
        return column.cast("string"), None
    ddl = f"{schema_ddl(fmt, base_dir)}, `{CORRUPT}` STRING"  # json, csv: FormatConfig requires a schema
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    if fmt.type == "csv":
        parsed = F.from_csv(column.cast("string"), ddl, options)
        problem = "malformed CSV or a field of the wrong type"
    else:
        parsed = F.from_json(column.cast("string"), ddl, options)
        problem = "malformed JSON or a field of the wrong type"
    error = F.when(column.isNotNull() & parsed[CORRUPT].isNotNull(), F.lit(f"{which}: {problem}"))
    return parsed.dropFields(CORRUPT), error


def schema_ddl(fmt: FormatConfig, base_dir: Path | None) -> str:
    """A json or csv format's fields as Spark DDL: its `schema:` as written, or an .avsc file's record."""
    assert fmt.schema_file is not None
    if is_ddl(fmt.schema_file):
        return fmt.schema_file
    return record_fields_ddl(load_avsc(fmt.schema_file, base_dir))


def decode_in_spark(raw: DataFrame, entry: Any, base_dir: Path | None) -> DataFrame:
    """The reader's rows -> decoded key and value, metadata, and the poison columns."""
    from pyspark.sql import functions as F

    key, key_error = _decode(F.col("key"), entry.key_format, "key", base_dir)
    value, value_error = _decode(F.col("value"), entry.value_format, "value", base_dir)
    errors = [e for e in (key_error, value_error) if e is not None]
    if not errors:
        return raw.select(key.alias("key"), value.alias("value"), *METADATA, *POISON_COLUMNS)
    error = F.coalesce(F.col(ERROR), *errors)
    if entry.on_error == "fail":
        message = F.concat(
            F.lit(f"source {entry.name}: cannot decode the record at "), F.col("topic"), F.lit("/"),
            F.col("partition").cast("string"), F.lit(" offset "), F.col("offset").cast("string"), F.lit(": "), error,
            F.lit(" (on_error: fail; use on_error: skip or dlq to route such records instead)"),
        )  # fmt: skip
        # The typed envelope (eos.errors), built around the message at run time.
        envelope = to_wire(PoisonRecord("@@")).split("@@")
        check = F.when(error.isNotNull(), F.raise_error(F.concat(F.lit(envelope[0]), message, F.lit(envelope[1]))))
        raw = raw.filter(check.isNull())
        return raw.select(key.alias("key"), value.alias("value"), *METADATA, *POISON_COLUMNS)
    poison = error.isNotNull()
    return raw.select(
        F.when(~poison, key).alias("key"),
        F.when(~poison, value).alias("value"),
        *METADATA,
        error.alias(ERROR),
        F.coalesce(F.col(RAW_KEY), F.when(poison, F.col("key"))).alias(RAW_KEY),
        F.coalesce(F.col(RAW_VALUE), F.when(poison, F.col("value"))).alias(RAW_VALUE),
    )


def source_view(decoded: DataFrame, entry: Any) -> DataFrame:
    """The columns SQL sees, plus the poison columns. Raw and string values keep Spark's Kafka
    layout (key, value, topic, partition, offset, timestamp, headers). A record value (json,
    avro) is flattened: its fields become columns, and the Kafka metadata is named _key, _topic,
    _partition, _offset, _timestamp, _headers so it can never clash with a field."""
    from pyspark.sql import functions as F

    if entry.value_format.type not in ("json", "csv", "avro"):
        return decoded
    return decoded.select(
        "value.*", *[F.col(c).alias(f"_{c}") for c in ["key", *METADATA]], *[F.col(c) for c in POISON_COLUMNS]
    )

"""Avro keys and values, decoded and encoded per Arrow batch (Spark `arrow_udf`, fastavro).

Decoding one batch: every record is read with fastavro's `schemaless_reader` (compiled) from its
own bytes, then the whole batch becomes one Arrow array in a single `pa.array` call; logical
types (timestamps, dates) are read as their underlying ints and converted by Arrow casts, not
per value through Python datetimes. Pandas is never involved.

A record that cannot be decoded is not a task failure: the UDF returns
struct<value: record, error: string>, and the source's on_error policy decides (fail, skip, dlq).
A record must consume exactly its bytes: trailing bytes mean it was written with another schema.

Two layouts, by the format's `registry:`:
- plain: the Avro body alone, written with `schema:` (the writer schema);
- wire: Confluent's wire format (magic byte 0, 4-byte schema id, body) with a registry
  (eos_connectors/formats/registry.py). Decoding resolves each record's writer schema by its id.
  An id the registry definitively does not know (or whose schema is not Avro) is no answer a
  record may be routed by on the spot: the batch fails with `UnknownSchemaIds`, and the source
  asks the driver to record the ids as poison (eos.protocol.poison). Ids recorded so are poison
  from then on, in every replay, without asking the registry again (`poison_ids`).

Schema evolution: records are read with the writer schema and resolved to the reader schema
(`reader_schema:`, else `schema:`, else the subject's latest version in the registry), which also
fixes the Spark type of the column. A field added with a default reads as that default.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # at module level: Spark reads the UDFs' `pa.Array` type hints from here

from eos.api import ConfigError, DependencyUnavailable, PoisonRecord, crossing
from eos_connectors.formats.avro_schema import arrow_types, load_avsc, physical_schema, spark_type
from eos_connectors.formats.registry import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    Connection,
    UnknownSchemaId,
    UnknownSubject,
    connection,
    poison_decision,
    registry,
    wire_header,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

    from eos_connectors.formats.config import FormatConfig


@dataclass(frozen=True)
class AvroCodec:
    """Everything a Python worker needs (pickled into the UDF): schemas as JSON-able dicts in
    their physical form, resolved registry location, and the Arrow types."""

    which: str  # "key" or "value", for messages
    name: str  # the reader (decode) or writer (encode) schema's name, for messages
    reader: Any  # physical reader schema (decode) / writer schema (encode)
    writer: Any | None  # physical writer schema of plain Avro; None in wire format (by id)
    registry: Connection | None  # wire format: the registry (its repr shows no secret)
    schema_id: int | None  # encode in wire format: the id written before every body
    physical: Any  # pa.DataType
    natural: Any
    spark: Any
    ddl: str  # the Spark SQL type of the (reader) schema
    maps: bool  # the schema holds Avro maps (Arrow gives them as (key, value) pairs)


# ---------------------------------------------------------------------------------------------
# Building codecs on the driver
# ---------------------------------------------------------------------------------------------


def _schema_name(schema: Any) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return f"{schema.get('namespace') + '.' if schema.get('namespace') else ''}{schema['name']}"
    return str(schema.get("type") if isinstance(schema, dict) else schema)


def _has_maps(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_has_maps(s) for s in schema)
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "map":
        return True
    return any(_has_maps(v) for k, v in schema.items() if k in ("type", "items", "values")) or any(
        _has_maps(f["type"]) for f in schema.get("fields", [])
    )


def _codec(which: str, schema: Any, writer: Any | None, where: Connection | None, schema_id: int | None) -> AvroCodec:
    import fastavro

    try:
        if writer is not None:
            # An invalid writer schema fails at start-up, not as a poison record per record.
            fastavro.parse_schema(writer)
        physical, natural, spark = arrow_types(schema)
        ddl = spark_type(schema)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{which}: invalid Avro schema: {exc}") from exc
    return AvroCodec(
        which=which,
        name=_schema_name(schema),
        reader=physical_schema(schema),
        writer=physical_schema(writer) if writer is not None else None,
        registry=where,
        schema_id=schema_id,
        physical=physical,
        natural=natural,
        spark=spark,
        ddl=ddl,
        maps=_has_maps(schema),
    )


def _registry_call(where: Connection, what: str, call):
    try:
        return call(registry(where))
    except (UnknownSubject, UnknownSchemaId) as exc:
        raise ConfigError(f"schema registry {where.location}: {what}: {exc}") from None


def decode_codec(fmt: FormatConfig, which: str, base_dir: Path | None, topics: list[str] | None = None) -> AvroCodec:
    """The codec a source uses, with the reader schema fixed now (it is the column's type)."""
    schema = load_avsc(fmt.schema_file, base_dir) if fmt.schema_file else None
    reader = load_avsc(fmt.reader_schema, base_dir) if fmt.reader_schema else schema
    if not fmt.registry:
        assert schema is not None  # FormatConfig requires schema or registry for avro
        return _codec(which, reader, schema, None, None)
    location = connection(fmt.registry, base_dir)
    if reader is None:
        subject = fmt.subject or (f"{topics[0]}-{which}" if topics and len(topics) == 1 else None)
        if subject is None:
            raise ConfigError(
                f"{which}_format: with a registry and no `schema:`, say which subject's latest schema to read as "
                "(`subject:`), or give `reader_schema:`"
            )
        _, reader = _registry_call(location, f"subject {subject}", lambda r: r.latest(subject))
    return _codec(which, reader, None, location, None)


def encode_codec(fmt: FormatConfig, which: str, base_dir: Path | None, topic: str | None = None) -> AvroCodec:
    """The codec a sink uses. In wire format the schema is registered (or found) now, on the driver,
    so every task writes the same id and executors never call the registry."""
    schema = load_avsc(fmt.schema_file, base_dir) if fmt.schema_file else None
    if not fmt.registry:
        assert schema is not None
        return _codec(which, schema, None, None, None)
    location = connection(fmt.registry, base_dir)
    subject = fmt.subject or (f"{topic}-{which}" if topic else None)
    if subject is None:
        raise ConfigError(f"{which}_format: with a registry, say which subject to write under (`subject:`)")
    if schema is None:
        schema_id, schema = _registry_call(location, f"subject {subject}", lambda r: r.latest(subject))
    else:
        schema_id = _registry_call(location, f"registering under {subject}", lambda r: r.register(subject, schema))
    return _codec(which, schema, None, location, schema_id)


# ---------------------------------------------------------------------------------------------
# Per Arrow batch (runs in Spark's Python workers)
# ---------------------------------------------------------------------------------------------

_parsed: dict[str, Any] = {}  # parsed fastavro schemas by JSON text, per process


def _parse(schema: Any) -> Any:
    import json

    import fastavro

    key = json.dumps(schema, sort_keys=True)
    parsed = _parsed.get(key)
    if parsed is None:
        parsed = _parsed[key] = fastavro.parse_schema(schema)
    return parsed


_writers_by_id: dict[tuple[str, int], Any] = {}


class UnknownSchemaIds(DependencyUnavailable):
    """Records of a batch name schema ids the registry definitively does not know (or whose
    schemas are not Avro). Not a verdict on the records yet: the source has the ids recorded
    as poison first (eos.protocol.poison); without that it stays a retriable failure."""

    def __init__(self, message: str, hint: str | None = None, decisions: list[str] | None = None, first: int = 0):
        super().__init__(message, hint)
        self.decisions = list(decisions or [])  # poison_decision() of each id
        self.first = first  # the batch index of the first record that names one


def _writer_for_id(where: Connection, schema_id: int) -> Any:
    """The parsed (physical) writer schema of an id. Only found schemas are cached. Raises
    UnknownSchemaId for an id that has no Avro schema fastavro can read, by the registry's own
    answer (RegistryUnavailable when it gave none)."""
    from fastavro.schema import SchemaParseException

    key = (where.location, schema_id)
    if key not in _writers_by_id:
        schema = registry(where).schema_by_id(schema_id)
        try:
            _writers_by_id[key] = _parse(physical_schema(schema))
        except (ValueError, TypeError, KeyError, AttributeError, SchemaParseException) as exc:
            raise UnknownSchemaId(f"schema id {schema_id} is not an Avro schema fastavro can read: {exc}") from None
    return _writers_by_id[key]


class _BadRecord(Exception):
    pass


# Why a recorded id is poison, in words that stay the same in every replay (the dead-letter
# queue's `eos.error` header): the registry's answer is not asked again.
_RECORDED = "the registry had no Avro schema for it when it was first met (recorded in the checkpoint)"


def _explain(codec: AvroCodec, exc: BaseException) -> str:
    if isinstance(exc, _BadRecord):
        detail = str(exc)
    elif isinstance(exc, (EOFError, IndexError, OverflowError, MemoryError)):
        # fastavro reading past the end, or a length or union index that makes no sense
        detail = f"truncated or not Avro ({type(exc).__name__}: {str(exc)[:100] or 'ran out of bytes'})"
    elif isinstance(exc, UnicodeDecodeError):
        detail = "a string field is not valid UTF-8 (not written with this schema?)"
    else:
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        detail = f"{type(exc).__name__}{': ' + text if text else ''}"
    return f"{codec.which}: not Avro of schema {codec.name}: {detail}"


def decode_batch(codec: AvroCodec, column: pa.Array, poison_ids: frozenset[int] = frozenset()) -> pa.StructArray:
    """Binary array -> struct<value: record, error: string>, one Arrow array for the batch.
    `poison_ids`: schema ids recorded as poison (eos.protocol.poison); their records are poison
    without asking the registry. Raises UnknownSchemaIds for any other id it definitively lacks."""
    from fastavro import schemaless_reader

    reader = _parse(codec.reader)
    plain_writer = _parse(codec.writer) if codec.writer is not None else None
    records: list[Any] = []
    errors: list[str | None] = []
    where = codec.registry
    unknown: dict[int, str] = {}  # schema id -> the registry's answer, in the order first met
    first_unknown = 0
    for raw in column.to_pylist():
        if raw is None:  # a tombstone is not poison
            records.append(None)
            errors.append(None)
            continue
        try:
            fo = io.BytesIO(raw)
            if plain_writer is not None:
                writer = plain_writer
            else:
                if len(raw) < HEADER_SIZE:
                    raise _BadRecord(f"{len(raw)} bytes: too short for the registry wire format (magic byte + id)")
                magic, schema_id = HEADER.unpack_from(raw)
                if magic != MAGIC:
                    raise _BadRecord(f"magic byte {magic & 0xFF:#04x}, expected {MAGIC:#04x} (registry wire format)")
                if schema_id in poison_ids:
                    raise _BadRecord(f"schema id {schema_id} is recorded as poison for this pipeline: {_RECORDED}")
                assert where is not None
                try:
                    writer = _writer_for_id(where, schema_id)
                except UnknownSchemaId as answer:
                    if not unknown:
                        first_unknown = len(records)
                    unknown.setdefault(schema_id, str(answer))
                    records.append(None)
                    errors.append(None)
                    continue
                fo.seek(HEADER_SIZE)
            record = schemaless_reader(fo, writer, reader)
            if fo.tell() != len(raw):
                raise _BadRecord(f"{len(raw) - fo.tell()} bytes left over after the record (another schema?)")
        except DependencyUnavailable:
            raise  # not the record's fault: fail the task, the epoch is retried
        except Exception as exc:
            records.append(None)
            errors.append(_explain(codec, exc))
            continue
        records.append(record)
        errors.append(None)
    if unknown:
        assert where is not None
        location = where.location
        raise UnknownSchemaIds(
            f"{codec.which}: schema registry {location} has no Avro schema for an id: " + "; ".join(unknown.values()),
            decisions=[poison_decision(location, schema_id) for schema_id in unknown],
            first=first_unknown,
        )
    values = pa.array(records, type=codec.natural)
    if codec.natural != codec.spark:
        values = values.cast(codec.spark)
    return pa.StructArray.from_arrays([values, pa.array(errors, type=pa.string())], names=["value", "error"])


def _map_fixer(schema: Any, named: dict[str, Any] | None = None):
    """A function that turns Arrow's map values ([(k, v), ...]) into dicts for fastavro, or None
    where the schema holds no map."""
    named = {} if named is None else named
    if isinstance(schema, str):
        return named.get(schema)
    if isinstance(schema, list):
        fixers = [f for f in (_map_fixer(s, named) for s in schema if s != "null") if f]
        return fixers[0] if fixers else None
    kind = schema.get("type")
    if kind == "map":
        inner = _map_fixer(schema["values"], named)
        if inner is None:
            return lambda v: dict(v) if v is not None else None
        return lambda v: {k: inner(x) for k, x in v} if v is not None else None
    if kind == "array":
        inner = _map_fixer(schema["items"], named)
        return (lambda v: [inner(x) for x in v] if v is not None else None) if inner else None
    if kind == "record":
        fields = [(f["name"], _map_fixer(f["type"], named)) for f in schema["fields"]]
        fields = [(n, f) for n, f in fields if f]
        if not fields:
            return None

        def fix(v: dict[str, Any] | None) -> dict[str, Any] | None:
            if v is not None:
                for name, fixer in fields:
                    v[name] = fixer(v[name])
            return v

        named[schema["name"]] = fix
        return fix
    if isinstance(kind, (dict, list)):
        return _map_fixer(kind, named)
    return None


def encode_batch(codec: AvroCodec, column: pa.Array) -> pa.Array:
    """Struct (or scalar) array -> binary array: all bodies written into one buffer, the Arrow
    array built on it without copying."""
    from fastavro import schemaless_writer

    writer = _parse(codec.reader)
    values = column
    if values.type != codec.natural:
        values = values.cast(codec.natural, safe=False)  # microseconds -> the schema's unit
    if codec.natural != codec.physical:
        values = values.cast(codec.physical)
    rows = values.to_pylist()
    fixer = _map_fixer(codec.reader) if codec.maps else None
    header = wire_header(codec.schema_id) if codec.schema_id is not None else b""
    out = io.BytesIO()
    offsets = [0]
    valid = []
    for row in rows:
        if row is None:
            offsets.append(out.tell())
            valid.append(False)
            continue
        out.write(header)
        try:
            schemaless_writer(out, writer, fixer(row) if fixer else row)
        except Exception as exc:
            # The same record fails the same way in every replay: stop, don't retry.
            raise PoisonRecord(
                f"cannot encode a {codec.which} as Avro of schema {codec.name}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''} (record: {row!r:.300})"
            ) from None
        offsets.append(out.tell())
        valid.append(True)
    validity = pa.array(valid, type=pa.bool_()).buffers()[1] if not all(valid) else None
    return pa.Array.from_buffers(
        pa.binary(),
        len(rows),
        [validity, pa.array(offsets, type=pa.int32()).buffers()[1], pa.py_buffer(out.getvalue())],
        null_count=valid.count(False),
    )


# ---------------------------------------------------------------------------------------------
# Spark columns
# ---------------------------------------------------------------------------------------------


def decode_column(
    column: Column, fmt: FormatConfig, which: str, base_dir: Path | None, topics: list[str] | None = None
) -> tuple[Column, Column]:
    """(decoded column, error message column or null). Spark evaluates the UDF once for both."""
    result = decode_with(decode_codec(fmt, which, base_dir, topics), column)
    return result["value"], result["error"]


def decode_with(codec: AvroCodec, column: Column) -> Column:
    return decode_udf(codec)(column)


def decode_udf(codec: AvroCodec) -> Any:
    """The decode as an `arrow_udf` (bytes -> struct<value, error>), for callers that must set how
    Spark treats it (the benchmark's baseline marks it nondeterministic)."""
    from pyspark.sql import functions as F

    @F.arrow_udf(f"STRUCT<value: {codec.ddl}, error: STRING>")
    def decode_avro(values: pa.Array) -> pa.Array:
        with crossing():
            return decode_batch(codec, values)

    return decode_avro


def encode_column(
    column: Column, fmt: FormatConfig, which: str, base_dir: Path | None, topic: str | None = None
) -> Column:
    """A column of the schema's Spark type -> Avro bytes (binary)."""
    return encode_with(encode_codec(fmt, which, base_dir, topic), column)


def encode_with(codec: AvroCodec, column: Column) -> Column:
    from pyspark.sql import functions as F

    @F.arrow_udf("BINARY")
    def encode_avro(values: pa.Array) -> pa.Array:
        with crossing():
            return encode_batch(codec, values)

    return encode_avro(column)


def fit_to_schema(column: Column, data_type: Any, codec: AvroCodec, what: str) -> Column:
    """Shape a sink's value (or key) column as the schema's Spark type: a record's fields are
    matched by name (Spark casts structs by position) and cast; a missing nullable field is null.
    Mismatches are configuration errors, reported before the pipeline starts."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType, StructType

    target = DataType.fromDDL(codec.ddl)
    if not isinstance(target, StructType):
        return column.cast(target)
    if not isinstance(data_type, StructType):
        raise ConfigError(
            f"{what}: schema {codec.name} is a record, but the value is {data_type.simpleString()}; "
            f"make the value a struct with fields {', '.join(target.fieldNames())}"
        )
    have = {f.name: f for f in data_type.fields}
    extra = sorted(set(have) - set(target.fieldNames()))
    missing = [f.name for f in target.fields if f.name not in have and not _nullable(codec.reader, f.name)]
    if extra or missing:
        raise ConfigError(
            f"{what}: the value does not fit schema {codec.name} (fields {', '.join(target.fieldNames())}): "
            + "; ".join(
                p
                for p in (
                    f"not in the schema: {', '.join(extra)}" if extra else "",
                    f"missing: {', '.join(missing)}" if missing else "",
                )
                if p
            ),
            hint="select or alias the columns to the schema's field names (value: struct(a, b AS c, ...))",
        )
    return F.struct(
        *[(column[f.name] if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name) for f in target.fields]
    )


def _nullable(schema: Any, field: str) -> bool:
    for f in schema.get("fields", []):
        if f["name"] == field:
            return isinstance(f["type"], list) and "null" in f["type"]
    return False

"""The Avro and JSON codecs on a real local SparkSession: round trips, schema evolution, nulls,
nested types, logical types, the registry wire format, and malformed input becoming errors."""

from __future__ import annotations

import io
import json
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import fastavro
import pytest

from eos.errors import ConfigError
from eos_connectors.formats import avro
from eos_connectors.formats.avro_schema import arrow_types, load_avsc, spark_type
from eos_connectors.formats.config import FormatConfig
from eos_connectors.formats.registry import FileRegistry, wire_header

EVERYTHING = {
    "type": "record",
    "name": "Everything",
    "namespace": "eos.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "double"},
        {"name": "small", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "flag", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": ["null", "int"]},
                    {"name": "notes", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
                ],
            },
        },
        {"name": "previous", "type": ["null", "Address"], "default": None},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    ],
}

AT = datetime(2026, 1, 1, 12, 30, 45, 123000, tzinfo=timezone.utc)


def record(i: int) -> dict:
    return {
        "id": i,
        "name": f"name-{i}",
        "maybe": None if i % 2 else f"m{i}",
        "score": i / 4,
        "small": -i,
        "ratio": 0.5,
        "flag": i % 3 == 0,
        "blob": bytes([i % 256, 0, 255]),
        "kind": "AB"[i % 2],
        "at": AT,
        "at_us": datetime(2026, 1, 1, 0, 0, 0, 654321, tzinfo=timezone.utc),
        "local": datetime(2026, 5, 6, 7, 8, 9, 10000),
        "day": date(2026, 2, 3),
        "amount": Decimal("1234.50"),
        "tags": [f"t{j}" for j in range(i % 3)],
        "attrs": {f"k{j}": j for j in range(i % 4)},
        "address": {"city": "Berlin", "zip": None if i % 2 else 10115, "notes": {"x": ["a", "b"], "y": []}},
        "previous": None if i % 2 else {"city": "Paris", "zip": 75001, "notes": {}},
        "hash": b"\x00\x01\x02\x03",
    }


def avro_bytes(schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def write_schema(folder: Path, name: str, schema: dict) -> str:
    path = folder / name
    path.write_text(json.dumps(schema))
    return str(path)


def decode_rows(spark, payloads: list[bytes | None], fmt: FormatConfig, base_dir: Path | None = None):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, p) for i, p in enumerate(payloads)], "i int, v binary")
    value, error = avro.decode_column(F.col("v"), fmt, "value", base_dir)
    rows = df.select("i", value.alias("value"), error.alias("error")).orderBy("i").collect()
    return [(r["value"].asDict(recursive=True) if r["value"] else None, r["error"]) for r in rows]


def test_arrow_types_match_what_spark_expects_for_the_same_schema(spark):
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import DataType

    _, _, arrow = arrow_types(EVERYTHING)
    expected = to_arrow_type(DataType.fromDDL(spark_type(EVERYTHING)), timezone="UTC")
    assert arrow == expected


def test_decodes_independently_written_avro_with_every_type(spark, tmp_path):
    schema = write_schema(tmp_path, "everything.avsc", EVERYTHING)
    payloads = [avro_bytes(EVERYTHING, record(i)) for i in range(6)]
    rows = decode_rows(spark, payloads, FormatConfig(type="avro", schema=schema))
    assert [e for _, e in rows] == [None] * 6
    first, second = rows[0][0], rows[1][0]
    assert first["id"] == 0 and first["name"] == "name-0" and first["maybe"] == "m0" and second["maybe"] is None
    assert first["kind"] == "A" and second["kind"] == "B"
    assert first["blob"] == bytes([0, 0, 255]) and first["hash"] == b"\x00\x01\x02\x03"
    # timestamp-millis and -micros are instants (Spark TIMESTAMP), shown in the session's UTC
    assert first["at"] == AT.replace(tzinfo=None)
    assert first["at_us"] == datetime(2026, 1, 1, 0, 0, 0, 654321)
    assert first["local"] == datetime(2026, 5, 6, 7, 8, 9, 10000)  # TIMESTAMP_NTZ
    assert first["day"] == date(2026, 2, 3) and first["amount"] == Decimal("1234.50")
    assert rows[2][0]["tags"] == ["t0", "t1"] and rows[3][0]["attrs"] == {"k0": 0, "k1": 1, "k2": 2}
    assert first["address"]["notes"] == {"x": ["a", "b"], "y": []} and first["address"]["zip"] == 10115
    assert first["previous"]["city"] == "Paris" and second["previous"] is None


def test_timestamp_columns_have_spark_timestamp_types(spark, tmp_path):
    from pyspark.sql import functions as F

    schema = write_schema(tmp_path, "everything.avsc", EVERYTHING)
    df = spark.createDataFrame([(avro_bytes(EVERYTHING, record(0)),)], "v binary")
    value, _ = avro.decode_column(F.col("v"), FormatConfig(type="avro", schema=schema), "value", None)
    fields = {f.name: f.dataType.simpleString() for f in df.select(value.alias("r")).schema["r"].dataType.fields}
    assert fields["at"] == "timestamp" and fields["at_us"] == "timestamp" and fields["local"] == "timestamp_ntz"
    assert fields["day"] == "date" and fields["amount"] == "decimal(10,2)" and fields["kind"] == "string"
    epoch_ms = df.select(F.unix_millis(value["at"]).alias("ms")).first()["ms"]
    assert epoch_ms == int(AT.timestamp() * 1000)


def test_round_trip_through_encode_and_decode(spark, tmp_path):
    from pyspark.sql import functions as F

    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "everything.avsc", EVERYTHING))
    payloads = [avro_bytes(EVERYTHING, record(i)) for i in range(5)]
    df = spark.createDataFrame([(i, p) for i, p in enumerate(payloads)], "i int, v binary")
    value, _ = avro.decode_column(F.col("v"), fmt, "value", None)
    decoded = df.select("i", value.alias("r"))
    encoded = decoded.select("i", avro.encode_column(F.col("r"), fmt, "value", None).alias("bytes"))
    rows = encoded.orderBy("i").collect()
    # Byte for byte what fastavro writes for the same values: the encoder is a faithful writer.
    assert [r["bytes"] for r in rows] == payloads
    again, error = avro.decode_column(F.col("bytes"), fmt, "value", None)
    twice = encoded.select("i", again.alias("r"), error.alias("e")).orderBy("i").collect()
    assert [r["e"] for r in twice] == [None] * 5
    assert [r["r"] for r in twice] == [r["r"] for r in decoded.orderBy("i").collect()]


def test_encoding_many_rows_in_several_arrow_batches(spark, tmp_path):
    from pyspark.sql import functions as F

    schema = {"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}]}
    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "n.avsc", schema))
    df = spark.range(25_000).select(F.struct(F.col("id").alias("n"), F.col("id").cast("string").alias("s")).alias("r"))
    payloads = [r[0] for r in df.select(avro.encode_column(F.col("r"), fmt, "value", None)).collect()]
    parsed = fastavro.parse_schema(schema)
    decoded = sorted((fastavro.schemaless_reader(io.BytesIO(p), parsed) for p in payloads), key=lambda r: r["n"])
    assert decoded == [{"n": i, "s": str(i)} for i in range(25_000)]


def test_null_values_are_tombstones_not_errors(spark, tmp_path):
    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "everything.avsc", EVERYTHING))
    rows = decode_rows(spark, [None, avro_bytes(EVERYTHING, record(1))], fmt)
    assert rows[0] == (None, None)
    assert rows[1][1] is None and rows[1][0]["id"] == 1


def test_malformed_values_become_errors_not_task_failures(spark, tmp_path):
    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "everything.avsc", EVERYTHING))
    good = avro_bytes(EVERYTHING, record(0))
    payloads = [good, good[:-3], b"", b'{"id": 1}', good + b"\x00\x01", b"\xff" * 40, good]
    rows = decode_rows(spark, payloads, fmt)
    assert rows[0][1] is None and rows[-1][1] is None and rows[0][0]["id"] == 0
    errors = [e for _, e in rows[1:-1]]
    assert all(e and e.startswith("value: not Avro of schema eos.test.Everything") for e in errors), errors
    assert [v for v, _ in rows[1:-1]] == [None] * 5
    assert "truncated" in errors[0] and "truncated" in errors[1]
    assert "2 bytes left over after the record" in errors[3]


def test_evolution_field_added_with_a_default(spark, tmp_path):
    v1 = {
        "type": "record",
        "name": "User",
        "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
    }
    v2 = {
        "type": "record",
        "name": "User",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "country", "type": "string", "default": "unknown"},
            {"name": "age", "type": ["null", "int"], "default": None},
        ],
    }
    fmt = FormatConfig(
        type="avro", schema=write_schema(tmp_path, "v1.avsc", v1), reader_schema=write_schema(tmp_path, "v2.avsc", v2)
    )
    rows = decode_rows(spark, [avro_bytes(v1, {"id": 1, "name": "ada"})], fmt)
    assert rows == [({"id": 1, "name": "ada", "country": "unknown", "age": None}, None)]


def test_evolution_incompatible_reader_is_a_record_error(spark, tmp_path):
    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    v2 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}, {"name": "x", "type": "string"}]}
    fmt = FormatConfig(
        type="avro", schema=write_schema(tmp_path, "v1.avsc", v1), reader_schema=write_schema(tmp_path, "v2.avsc", v2)
    )
    [(value, error)] = decode_rows(spark, [avro_bytes(v1, {"id": 1})], fmt)
    assert value is None and "SchemaResolutionError" in error and "x" in error


def test_file_registry_wire_format_round_trip_and_poison(spark, tmp_path):
    from pyspark.sql import functions as F

    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    v2 = {
        "type": "record",
        "name": "User",
        "fields": [{"name": "id", "type": "long"}, {"name": "plan", "type": "string", "default": "free"}],
    }
    folder = tmp_path / "registry"
    files = FileRegistry(folder)
    id1 = files.register("users-value", v1)
    assert files.register("users-value", v1) == id1  # registering the same schema again: same id
    fmt_v2 = FormatConfig(type="avro", schema=write_schema(tmp_path, "v2.avsc", v2), registry=f"file:{folder}")
    # The sink writes v2 under the topic's subject: registered now, its id before every body.
    df = spark.createDataFrame([(7, "pro")], "id long, plan string").select(F.struct("id", "plan").alias("r"))
    [encoded] = [r[0] for r in df.select(avro.encode_column(F.col("r"), fmt_v2, "value", None, "users")).collect()]
    id2 = files.latest("users-value")[0]
    assert id2 != id1 and encoded[:5] == wire_header(id2)
    old = wire_header(id1) + avro_bytes(v1, {"id": 1})
    reader = FormatConfig(type="avro", registry=f"file:{folder}", subject="users-value")
    payloads = [old, encoded, b"\x01" + old[1:], b"\x00\x00"]
    rows = decode_rows(spark, payloads, reader)
    assert rows[0] == ({"id": 1, "plan": "free"}, None)  # v1 record read as the latest (v2)
    assert rows[1] == ({"id": 7, "plan": "pro"}, None)
    assert rows[2][0] is None and "magic byte 0x01" in rows[2][1]  # the bytes are wrong: poison
    assert rows[3][0] is None and "too short for the registry wire format" in rows[3][1]
    # An id the registry does not know is not routed on the spot: the read fails, until the
    # source has the id recorded as poison (eos.protocol.poison; tests/integration/test_registry.py).
    with pytest.raises(Exception, match=r"has no Avro schema for an id: schema id 999: no 999\.avsc"):
        decode_rows(spark, [wire_header(999) + avro_bytes(v1, {"id": 2})], reader)


def test_registry_folder_missing_is_not_blamed_on_records(spark, tmp_path):
    from pyspark.sql import functions as F

    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    folder = tmp_path / "gone"
    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "v1.avsc", v1), registry=f"file:{folder}")
    df = spark.createDataFrame([(wire_header(1) + avro_bytes(v1, {"id": 1}),)], "v binary")
    value, _ = avro.decode_column(F.col("v"), fmt, "value", None)
    with pytest.raises(Exception, match=r"schema registry folder .* does not exist"):
        df.select(value).collect()


def test_sink_value_must_fit_the_record_schema(spark, tmp_path):
    from eos_connectors.formats.encode import sink_columns
    from eos_connectors.kafka.config import KafkaSinkEntry

    schema = {
        "type": "record",
        "name": "Out",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],
    }
    path = write_schema(tmp_path, "out.avsc", schema)
    view = spark.createDataFrame([(1, "x", 2.0)], "a int, b string, c double")
    sink = KafkaSinkEntry.model_validate(
        {"name": "out", "kafka": {"bootstrap": "x:1", "topic": "t"}, "value_format": {"type": "avro", "schema": path}}
    )
    with pytest.raises(
        ConfigError, match=r"sink out: value_format: value: the value does not fit schema Out .*: not in the schema: c"
    ):
        sink_columns(view, sink)
    # Fields matched by name (and cast: a is INT in Spark, long in Avro), in any order; the slot
    # writer encodes the struct.
    fitted = sink.model_copy(update={"value": "struct(b, a)"})
    rows = sink_columns(view, fitted).toArrow()
    codec = avro.encode_codec(fitted.value_format, "value", None, "t")
    [encoded] = avro.encode_batch(codec, rows.column("value").combine_chunks()).to_pylist()
    assert fastavro.schemaless_reader(io.BytesIO(encoded), fastavro.parse_schema(schema)) == {"a": 1, "b": "x"}


def test_encoding_a_value_the_schema_rejects_is_a_clear_permanent_error(spark, tmp_path):
    from pyspark.sql import functions as F

    schema = {"type": "record", "name": "Out", "fields": [{"name": "a", "type": "long"}]}
    fmt = FormatConfig(type="avro", schema=write_schema(tmp_path, "out.avsc", schema))
    df = spark.createDataFrame([(None,)], "a long").select(F.struct("a").alias("r"))
    with pytest.raises(Exception, match=r"PoisonRecord.*cannot encode a value as Avro of schema Out"):
        df.select(avro.encode_column(F.col("r"), fmt, "value", None)).collect()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"schema file 'absent.avsc' not found"),
        ("{not json", r"is not valid JSON: line 1"),
        ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "strnig"}]}', r"not a valid Avro schema"),
    ],
)
def test_schema_file_missing_or_invalid(tmp_path, content, message):
    name = "absent.avsc"
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_avsc(name, tmp_path)


def test_json_decoding_marks_malformed_records(spark, tmp_path):
    from pyspark.sql import functions as F

    from eos_connectors.formats.decode import _decode

    schema = {"type": "record", "name": "J", "fields": [{"name": "a", "type": "long"}]}
    fmt = FormatConfig(type="json", schema=write_schema(tmp_path, "j.avsc", schema))
    df = spark.createDataFrame([(0, b'{"a": 5}'), (1, b'{"a": '), (2, b'{"a": "x"}')], "i int, v binary")
    value, error = _decode(F.col("v"), fmt, "value", None)
    rows = df.select("i", value.alias("v"), error.alias("e")).orderBy("i").collect()
    assert rows[0]["v"]["a"] == 5 and rows[0]["e"] is None
    assert rows[1]["e"] and rows[2]["e"] and "malformed JSON" in rows[1]["e"]

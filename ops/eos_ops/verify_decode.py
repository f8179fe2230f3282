"""`eos verify`'s own decoders for a pipeline's formats: Kafka bytes -> Python values of the
Spark types the pipeline declares, with no eos connector code (the check must not share a
code path with what it checks).

A record these decoders reject is poison: it is expected in the source's dead-letter queue, not
in any sink. JSON follows the rules of Spark's `from_json` (the reader eos uses) as far as they
decide poison: malformed JSON, or a field of the wrong type (a string where a number is
declared, a fraction for an integer, a number out of range, a value that is not an object).
Fields the schema lacks are ignored, missing fields are null, and text after the first JSON value
is ignored, as Spark does (checked against Spark 4.3's from_json on 39 cases). Avro is read with
fastavro; trailing bytes are poison, as in eos.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from datetime import date, datetime, timezone, tzinfo
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from eos.errors import ConfigError, EnvironmentProblem
from eos.paths import schemas_dir


class Poison(Exception):
    """The bytes do not decode under the declared format: why."""


# ---------------------------------------------------------------------------------------------
# Schemas: an .avsc file (Avro or JSON), as Spark types
# ---------------------------------------------------------------------------------------------


def schema_file(name: str, base_dir: Path | None) -> Path:
    """An .avsc reference as eos resolves it: a path (relative to the pipeline file), or a file
    name in schemas/."""
    candidates = [Path(name)] if Path(name).is_absolute() else []
    if base_dir is not None:
        candidates.append(base_dir / name)
    candidates += [Path.cwd() / name, schemas_dir() / name, schemas_dir() / Path(name).name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"schema file {name!r} not found (looked in {', '.join(str(c.parent) for c in candidates)})")


def load_avsc(name: str, base_dir: Path | None) -> Any:
    path = schema_file(name, base_dir)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"schema file {path} is not valid JSON: line {exc.lineno}: {exc.msg}") from exc


def spark_type(schema: Any, named: dict[str, Any] | None = None) -> Any:
    """The Spark type of an Avro schema (the mapping of docs/FORMATS.md)."""
    from pyspark.sql import types as T

    named = {} if named is None else named
    primitives = {
        "string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(),
        "double": T.DoubleType(), "boolean": T.BooleanType(), "bytes": T.BinaryType(), "null": T.NullType(),
    }  # fmt: skip
    if isinstance(schema, str):
        if schema in primitives:
            return primitives[schema]
        if schema in named:
            return named[schema]
        raise ConfigError(f"Avro type {schema!r} is not defined")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ConfigError(f"Avro unions of several non-null types are not supported: {schema}")
        return spark_type(branches[0], named)
    kind, logical = schema.get("type"), schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return T.TimestampNTZType()
    if logical == "date":
        return T.DateType()
    if logical == "decimal":
        return T.DecimalType(schema["precision"], schema.get("scale", 0))
    if kind in ("record", "error"):
        struct = T.StructType([T.StructField(f["name"], spark_type(f["type"], named)) for f in schema["fields"]])
        named[schema["name"]] = struct
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = struct
        return struct
    if kind in ("enum", "fixed"):
        named[schema["name"]] = T.StringType() if kind == "enum" else T.BinaryType()
        return named[schema["name"]]
    if kind == "array":
        return T.ArrayType(spark_type(schema["items"], named))
    if kind == "map":
        return T.MapType(T.StringType(), spark_type(schema["values"], named))
    return spark_type(kind, named)


# ---------------------------------------------------------------------------------------------
# JSON, as Spark's from_json reads it
# ---------------------------------------------------------------------------------------------

_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "+Infinity": float("inf"), "INF": float("inf"),
                   "+INF": float("inf"), "-Infinity": float("-inf"), "-INF": float("-inf")}  # fmt: skip
_RANGES = {"ByteType": 8, "ShortType": 16, "IntegerType": 32, "LongType": 64}


def from_json(text: bytes, struct: Any, zone: tzinfo) -> dict[str, Any] | None:
    """A JSON value as a row of `struct` (a dict), or Poison. Empty input is a null value."""
    if not text.strip():
        return None
    try:  # Spark reads the first JSON value and ignores what follows it
        value, _ = json.JSONDecoder().raw_decode(text.decode("utf-8").lstrip())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Poison(f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Poison(f"a JSON {type(value).__name__}, not an object")
    return _json_value(value, struct, zone, "")


def _json_value(value: Any, data_type: Any, zone: tzinfo, where: str) -> Any:
    if value is None:
        return None
    kind = type(data_type).__name__
    shown = json.dumps(value)[:60]
    wrong = Poison(f"field {where.lstrip('.') or 'value'}: {shown} is not a {data_type.simpleString()}")
    if kind == "StringType":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if kind in _RANGES:
        bits = _RANGES[kind]
        if isinstance(value, int) and not isinstance(value, bool) and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return value
        raise wrong
    if kind in ("DoubleType", "FloatType"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        raise wrong
    if kind == "BooleanType":
        if isinstance(value, bool):
            return value
        raise wrong
    if kind == "DecimalType":
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                number = Decimal(value if isinstance(value, str) else repr(value))
                number = number.quantize(Decimal(1).scaleb(-data_type.scale))
            except InvalidOperation:
                raise wrong from None
            if len(number.as_tuple().digits) > data_type.precision:
                raise wrong
            return number
        raise wrong
    if kind in ("TimestampType", "TimestampNTZType"):
        if isinstance(value, int) and not isinstance(value, bool) and kind == "TimestampType":
            return datetime.fromtimestamp(value, tz=timezone.utc)  # seconds since the epoch
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.replace(" ", "T", 1))
            except ValueError:
                raise wrong from None
            if kind == "TimestampNTZType":
                return parsed.replace(tzinfo=None)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=zone)
        raise wrong
    if kind == "DateType":
        if isinstance(value, str):
            try:
                return date.fromisoformat(value[:10])
            except ValueError:
                raise wrong from None
        raise wrong
    if kind == "BinaryType":
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                raise wrong from None
        raise wrong
    if kind == "StructType":
        if not isinstance(value, dict):
            raise wrong
        return {f.name: _json_value(value.get(f.name), f.dataType, zone, f"{where}.{f.name}") for f in data_type.fields}
    if kind == "ArrayType":
        if not isinstance(value, list):
            raise wrong
        return [_json_value(v, data_type.elementType, zone, f"{where}[]") for v in value]
    if kind == "MapType":
        if not isinstance(value, dict):
            raise wrong
        return {k: _json_value(v, data_type.valueType, zone, f"{where}.{k}") for k, v in value.items()}
    raise ConfigError(f"eos verify cannot read JSON as {data_type.simpleString()}")


# ---------------------------------------------------------------------------------------------
# A format (key_format / value_format of a pipeline entry) -> a decoder
# ---------------------------------------------------------------------------------------------


class FormatDecoder:
    """Decodes one side (key or value) of a topic's records as the entry's format declares, and
    gives its Spark type. `fmt` is the entry's format model (type, schema, reader_schema,
    registry, subject); `topic` names the registry subject's default."""

    def __init__(self, fmt: Any, base_dir: Path | None, zone: str = "UTC", topic: str = "", which: str = "value"):
        self.type = fmt.type
        self.base_dir = base_dir
        self.zone = ZoneInfo(zone)
        self.schema_name: str | None = getattr(fmt, "schema_file", None)
        self.reader_name: str | None = getattr(fmt, "reader_schema", None)
        self.registry: str | None = getattr(fmt, "registry", None)
        self.subject = getattr(fmt, "subject", None) or f"{topic}-{which}"
        self._writers: dict[int, Any] = {}
        self._struct: Any = None
        self._avro: tuple[Any, Any] | None = None

    # -- the Spark type ------------------------------------------------------------------------
    def spark_type(self) -> Any:
        from pyspark.sql import types as T

        if self.type == "raw":
            return T.BinaryType()
        if self.type == "string":
            return T.StringType()
        if self._struct is None:
            self._struct = self._declared_type()
        return self._struct

    def _declared_type(self) -> Any:
        if self.type == "json":
            if self.schema_name is None:
                raise ConfigError("format json needs a schema")
            if self._is_ddl(self.schema_name):
                from pyspark.sql.types import DataType

                return DataType.fromDDL(self.schema_name)
            return spark_type(load_avsc(self.schema_name, self.base_dir))
        return spark_type(self._reader_schema())

    def _is_ddl(self, name: str) -> bool:
        """A DDL string ("id STRING, amount DOUBLE") rather than an .avsc file name."""
        try:
            schema_file(name, self.base_dir)
            return False
        except ConfigError:
            return " " in name.strip()

    # -- decoding ------------------------------------------------------------------------------
    def decode(self, data: bytes | None) -> Any:
        """The value of `data` as its Spark type (None for a null), or Poison."""
        if data is None:
            return None
        if self.type == "raw":
            return bytes(data)
        if self.type == "string":
            return bytes(data).decode("utf-8", errors="replace")
        if self.type == "json":
            return from_json(bytes(data), self.spark_type(), self.zone)
        return self._decode_avro(bytes(data))

    def _decode_avro(self, data: bytes) -> Any:
        import fastavro

        if self.registry:
            if len(data) < 5 or data[0] != 0:
                raise Poison("not in the registry wire format (magic byte 0 and a 4-byte schema id)")
            writer, reader = self._writer(int.from_bytes(data[1:5], "big")), self._parsed(self._reader_schema())
            body = io.BytesIO(data[5:])
        else:
            writer, reader = self._avro_pair()
            body = io.BytesIO(data)
        try:
            value = fastavro.schemaless_reader(body, writer, reader)
        except Exception as exc:
            raise Poison(f"not Avro of the declared schema: {type(exc).__name__}: {exc}") from None
        left = len(body.getbuffer()) - body.tell()
        if left:
            raise Poison(f"{left} bytes left over after the record (another schema?)")
        return value

    def _avro_pair(self) -> tuple[Any, Any]:
        if self._avro is None:
            if not self.schema_name:
                raise ConfigError("format avro needs a schema")
            writer = self._parsed(load_avsc(self.schema_name, self.base_dir))
            reader = self._parsed(load_avsc(self.reader_name, self.base_dir)) if self.reader_name else None
            self._avro = (writer, reader)
        return self._avro

    @staticmethod
    def _parsed(schema: Any) -> Any:
        import fastavro

        return fastavro.parse_schema(schema)

    def _reader_schema(self) -> Any:
        for name in (self.reader_name, self.schema_name):
            if name:
                return load_avsc(name, self.base_dir)
        if not self.registry:
            raise ConfigError("format avro needs a schema or a registry")
        return self._registry_latest()

    def _writer(self, schema_id: int) -> Any:
        if schema_id not in self._writers:
            self._writers[schema_id] = self._parsed(self._registry_schema(schema_id))
        return self._writers[schema_id]

    # -- registries: a folder (file:DIR) or a Confluent-compatible URL, read plainly ----------
    def _registry_schema(self, schema_id: int) -> Any:
        assert self.registry is not None
        if self.registry.startswith("file:"):
            path = self._registry_dir() / f"{schema_id}.avsc"
            if not path.is_file():
                raise EnvironmentProblem(f"registry {self.registry}: schema id {schema_id} is unknown")
            return json.loads(path.read_text())
        return json.loads(self._get(f"/schemas/ids/{schema_id}")["schema"])

    def _registry_latest(self) -> Any:
        assert self.registry is not None
        if self.registry.startswith("file:"):
            subjects = json.loads((self._registry_dir() / "subjects.json").read_text())
            if not subjects.get(self.subject):
                raise EnvironmentProblem(f"registry {self.registry}: no subject {self.subject!r}")
            return self._registry_schema(subjects[self.subject][-1])
        return json.loads(self._get(f"/subjects/{self.subject}/versions/latest")["schema"])

    def _registry_dir(self) -> Path:
        assert self.registry is not None
        folder = Path(self.registry.removeprefix("file:"))
        return folder if folder.is_absolute() or self.base_dir is None else self.base_dir / folder

    def _get(self, path: str) -> Any:
        url = f"{self.registry.rstrip('/')}{path}"  # type: ignore[union-attr]
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return json.loads(answer.read())
        except OSError as exc:
            raise EnvironmentProblem(f"schema registry: GET {path} failed: {exc}") from None

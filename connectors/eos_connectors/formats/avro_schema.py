"""Avro schemas (.avsc files in schemas/) as Spark types: one schema language for every format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eos.api import ConfigError, schemas_dir

_PRIMITIVES = {
    "string": "STRING", "int": "INT", "long": "BIGINT", "float": "FLOAT", "double": "DOUBLE",
    "boolean": "BOOLEAN", "bytes": "BINARY", "null": "VOID",
}  # fmt: skip
_LOGICAL = {"timestamp-millis": "TIMESTAMP", "timestamp-micros": "TIMESTAMP", "date": "DATE",
            "local-timestamp-millis": "TIMESTAMP_NTZ", "local-timestamp-micros": "TIMESTAMP_NTZ"}  # fmt: skip


def resolve_schema_path(name: str, base_dir: Path | None = None) -> Path:
    """A schema reference: a path (relative to the pipeline file), or a file name in schemas/."""
    candidates = [Path(name)] if Path(name).is_absolute() else []
    if base_dir is not None:
        candidates.append(base_dir / name)
    candidates += [Path.cwd() / name, schemas_dir() / name, schemas_dir() / Path(name).name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"schema file {name!r} not found (looked in {', '.join(str(c.parent) for c in candidates)})")


def load_avsc(name: str, base_dir: Path | None = None) -> dict[str, Any]:
    path = resolve_schema_path(name, base_dir)
    try:
        schema = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"schema file {path} is not valid JSON: line {exc.lineno}: {exc.msg}") from exc
    try:
        import fastavro

        fastavro.parse_schema(schema)
    except Exception as exc:
        raise ConfigError(f"schema file {path} is not a valid Avro schema: {exc}") from exc
    return schema


def spark_type(schema: Any, named: dict[str, str] | None = None) -> str:
    """Spark SQL DDL type of an Avro schema."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise ConfigError(f"Avro type {schema!r} is not defined")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return spark_type(branches[0], named)
        raise ConfigError(f"Avro unions of several non-null types are not supported: {schema}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    if logical == "decimal":
        return f"DECIMAL({schema['precision']},{schema.get('scale', 0)})"
    if kind == "record":
        fields = ", ".join(f"`{f['name']}`: {spark_type(f['type'], named)}" for f in schema["fields"])
        ddl = f"STRUCT<{fields}>"
        named[schema["name"]] = ddl
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = ddl
        return ddl
    if kind == "enum":
        named[schema["name"]] = "STRING"
        return "STRING"
    if kind == "fixed":
        named[schema["name"]] = "BINARY"
        return "BINARY"
    if kind == "array":
        return f"ARRAY<{spark_type(schema['items'], named)}>"
    if kind == "map":
        return f"MAP<STRING, {spark_type(schema['values'], named)}>"
    return spark_type(kind, named)


def record_fields_ddl(schema: dict[str, Any]) -> str:
    """'a BIGINT, b STRING' for a record schema (the form from_json and createDataFrame take)."""
    if schema.get("type") != "record":
        raise ConfigError(f"expected an Avro record schema, got type {schema.get('type')!r}")
    named: dict[str, str] = {}
    return ", ".join(f"`{f['name']}` {spark_type(f['type'], named)}" for f in schema["fields"])


# ---------------------------------------------------------------------------------------------
# Arrow types (the codec in eos_connectors/formats/avro.py builds and reads Arrow arrays in bulk)
# ---------------------------------------------------------------------------------------------

# Logical types the codec converts in Arrow (vectorized) instead of per value in fastavro: the
# codec reads and writes them as their underlying int/long/string, which is 1.3x (decode) to
# 2.3x (encode) faster than going through Python datetime objects.
ARROW_LOGICAL = frozenset(
    {"timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros", "date",
     "time-millis", "time-micros", "uuid"}
)  # fmt: skip


def physical_schema(schema: Any) -> Any:
    """The schema with the logical types of ARROW_LOGICAL removed (decimal stays: fastavro turns it
    into Decimal, which Arrow takes as is). Writing or reading with it gives the same bytes."""
    if isinstance(schema, list):
        return [physical_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not (k == "logicalType" and v in ARROW_LOGICAL)}
    if out.get("type") == "record":
        out["fields"] = [{**f, "type": physical_schema(f["type"])} for f in schema["fields"]]
    elif out.get("type") == "array":
        out["items"] = physical_schema(schema["items"])
    elif out.get("type") == "map":
        out["values"] = physical_schema(schema["values"])
    elif isinstance(out.get("type"), (dict, list)):
        out["type"] = physical_schema(out["type"])
    return out


def arrow_types(schema: Any) -> tuple[Any, Any, Any]:
    """(physical, natural, spark) Arrow types of an Avro schema.

    physical: what fastavro reads and writes with `physical_schema` (timestamps as int64, dates as
    int32); natural: the logical types in their own unit (timestamp-millis as timestamp[ms]), which
    Arrow builds straight from those ints; spark: what Spark exchanges with Python UDFs
    (timestamps in microseconds, UTC), matching `spark_type`."""
    named: dict[str, tuple[Any, Any, Any]] = {}
    return _arrow(schema, named, None)


def _arrow(schema: Any, named: dict[str, tuple[Any, Any, Any]], namespace: str | None) -> tuple[Any, Any, Any]:
    import pyarrow as pa

    primitives = {
        "string": pa.string(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
        "double": pa.float64(), "boolean": pa.bool_(), "bytes": pa.binary(), "null": pa.null(),
    }  # fmt: skip
    if isinstance(schema, str):
        if schema in primitives:
            return (primitives[schema],) * 3
        for name in (schema, f"{namespace}.{schema}" if namespace else schema):
            if name in named:
                return named[name]
        raise ConfigError(f"Avro type {schema!r} is not defined")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return _arrow(branches[0], named, namespace)
        raise ConfigError(f"Avro unions of several non-null types are not supported: {schema}")
    kind, logical = schema.get("type"), schema.get("logicalType")
    base = primitives.get(kind) if isinstance(kind, str) else None
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        tz = None if logical.startswith("local") else "UTC"
        return pa.int64(), pa.timestamp("ms" if logical.endswith("millis") else "us", tz), pa.timestamp("us", tz)
    if logical == "date":
        return pa.int32(), pa.date32(), pa.date32()
    if logical == "decimal":
        decimal = pa.decimal128(schema["precision"], schema.get("scale", 0))
        return decimal, decimal, decimal
    if kind in ("record", "error"):
        full = _full_name(schema, namespace)
        inner_ns = full.rpartition(".")[0] or None
        fields = [(f["name"], _arrow(f["type"], named, inner_ns)) for f in schema["fields"]]
        types = tuple(pa.struct([(name, t[i]) for name, t in fields]) for i in range(3))
        _remember(named, schema, full, types)
        return types
    if kind in ("enum", "fixed"):
        types = (pa.string() if kind == "enum" else pa.binary(),) * 3
        _remember(named, schema, _full_name(schema, namespace), types)
        return types
    if kind == "array":
        items = _arrow(schema["items"], named, namespace)
        return tuple(pa.list_(t) for t in items)
    if kind == "map":
        values = _arrow(schema["values"], named, namespace)
        return tuple(pa.map_(pa.string(), t) for t in values)
    if base is not None:  # {"type": "long"} and logical types handled as their base type
        return (base,) * 3
    return _arrow(kind, named, namespace)


def _full_name(schema: dict[str, Any], namespace: str | None) -> str:
    name = schema["name"]
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _remember(named: dict[str, Any], schema: dict[str, Any], full: str, value: Any) -> None:
    named[full] = value
    named[schema["name"].rpartition(".")[2]] = value

"""Avro schemas (.avsc files in schemas/) as Spark types: one schema language for every format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eos.errors import ConfigError
from eos.paths import schemas_dir

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

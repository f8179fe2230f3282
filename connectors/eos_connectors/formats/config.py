"""How bytes map to columns, as written in a pipeline file (`key_format:`, `value_format:`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from eos.api import Model


class FormatConfig(Model):
    """Raw bytes, UTF-8 string, JSON, or Avro."""

    type: Literal["raw", "string", "json", "avro"] = "raw"
    schema_file: str | None = Field(None, alias="schema")  # .avsc (avro, json) file
    reader_schema: str | None = None  # avro: the schema to read as (evolution)
    registry: str | None = None  # Schema Registry URL, or file:DIR (wire format: magic byte + id)
    subject: str | None = None

    @model_validator(mode="after")
    def _schema_fits_type(self) -> FormatConfig:
        if self.type in ("raw", "string") and (self.schema_file or self.registry or self.reader_schema):
            raise ValueError(f"format {self.type} takes no schema")
        if self.type == "avro" and not (self.schema_file or self.registry):
            raise ValueError("format avro needs `schema:` (an .avsc file) or `registry:`")
        if self.type == "json" and (self.registry or self.reader_schema):
            raise ValueError("format json takes `schema:` only (registry and reader_schema are for avro)")
        if self.subject and not self.registry:
            raise ValueError("`subject:` names a schema registry subject; it needs `registry:`")
        if self.registry and not self.registry.startswith(("http://", "https://", "file:")):
            raise ValueError(f"registry {self.registry!r}: expected an http(s):// URL or file:DIR")
        return self

    @property
    def has_schema(self) -> bool:
        return bool(self.schema_file or self.registry)


# `value_format: json` is short for `value_format: {type: json}`.
Format = Annotated[FormatConfig, BeforeValidator(lambda v: {"type": v} if isinstance(v, str) else v)]

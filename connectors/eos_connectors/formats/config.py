"""How bytes map to columns, as written in a pipeline file (`key_format:`, `value_format:`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BeforeValidator, Field, SerializationInfo, model_serializer, model_validator

from eos.api import Model
from eos_connectors.formats.ddl import is_ddl

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def without_userinfo(url: str) -> str:
    """The URL with any `user:password@` taken out (what is kept, and what messages show)."""
    return _USERINFO.sub(r"\1", url)


class RegistryConfig(Model):
    """A Schema Registry: where it is, how eos signs in, and which CA vouches for it.

    `registry: URL` is short for `registry: {url: URL}`. Credentials written into the URL
    (`https://user:password@host/...`) are moved into `username`/`password` here, so that no URL
    eos keeps, logs or shows carries them. `password` and `token` are masked wherever config is
    shown (eos.api.redacted). The model's JSON form, which the checkpoint pins while an epoch is
    pending, is the URL alone: where schemas come from decides how a replay decodes; how eos signs
    in and which CA file it trusts do not, so a rotated password or a renewed CA file is not a change.
    """

    url: str  # http(s)://... (a Confluent-compatible API), or file:DIR
    username: str | None = None  # HTTP basic auth
    password: str | None = Field(None, repr=False)
    token: str | None = Field(None, repr=False)  # a bearer token, instead of basic auth
    ca_file: str | None = None  # PEM file of the CA(s) that sign an https registry's certificate

    @model_validator(mode="before")
    @classmethod
    def _userinfo_out_of_the_url(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            return data
        url = data["url"]
        if without_userinfo(url) == url:
            return data
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"registry {without_userinfo(url)!r}: expected an http(s):// URL or file:DIR")
        parts = urlsplit(url)
        if data.get("username") or data.get("password"):
            raise ValueError(
                f"registry {without_userinfo(url)}: credentials are given twice (in the URL and as username/password)"
            )
        return {
            **data,
            "url": without_userinfo(url),
            "username": unquote(parts.username or ""),
            "password": unquote(parts.password or ""),
        }

    @model_validator(mode="after")
    def _fits(self) -> RegistryConfig:
        where = self.url
        if not self.url.startswith(("http://", "https://", "file:")):
            raise ValueError(f"registry {where!r}: expected an http(s):// URL or file:DIR")
        remote = self.url.startswith(("http://", "https://"))
        if not remote and (self.username or self.password or self.token or self.ca_file):
            raise ValueError(f"registry {where}: a file: registry takes no username, password, token or ca_file")
        if (self.username is None) != (self.password is None):
            raise ValueError(f"registry {where}: basic auth needs both username and password")
        if self.username is not None and ":" in self.username:
            raise ValueError(f"registry {where}: a basic-auth username cannot contain ':'")
        if self.token is not None and self.username is not None:
            raise ValueError(f"registry {where}: give either username/password or token, not both")
        if self.ca_file and not self.url.startswith("https://"):
            raise ValueError(f"registry {where}: ca_file is for an https:// registry")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any, info: SerializationInfo) -> Any:
        # JSON (what the checkpoint pins, see the class doc): the URL alone.
        return self.url if info.mode_is_json() else handler(self)


def _registry(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value


# `registry: URL` is short for `registry: {url: URL}`, and `value_format: json` for `value_format:
# {type: json}`; json_schema_input_type tells the pipeline file's JSON Schema (`eos schema`) so.
Registry = Annotated[RegistryConfig, BeforeValidator(_registry, json_schema_input_type=str | RegistryConfig)]
FormatType = Literal["raw", "string", "json", "csv", "avro"]


class FormatConfig(Model):
    """Raw bytes, UTF-8 string, JSON, CSV or Avro."""

    type: FormatType = "raw"
    # json, csv: a Spark DDL string ("id STRING, amount DOUBLE") or an .avsc file; avro: an .avsc file
    schema_file: str | None = Field(None, alias="schema")
    reader_schema: str | None = None  # avro: the schema to read as (evolution)
    # Schema Registry URL or file:DIR, or {url, username, password | token, ca_file} (wire
    # format: magic byte + id)
    registry: Registry | None = None
    subject: str | None = None

    @model_validator(mode="after")
    def _schema_fits_type(self) -> FormatConfig:
        if self.type in ("raw", "string") and (self.schema_file or self.registry or self.reader_schema):
            raise ValueError(f"format {self.type} takes no schema")
        if self.type == "avro" and not (self.schema_file or self.registry):
            raise ValueError("format avro needs `schema:` (an .avsc file) or `registry:`")
        if self.type in ("json", "csv") and (self.registry or self.reader_schema):
            raise ValueError(f"format {self.type} takes `schema:` only (registry and reader_schema are for avro)")
        if self.type == "avro" and self.schema_file and is_ddl(self.schema_file):
            raise ValueError("format avro takes an .avsc file as `schema:` (a DDL string is for json and csv)")
        if self.subject and not self.registry:
            raise ValueError("`subject:` names a schema registry subject; it needs `registry:`")
        return self

    @property
    def has_schema(self) -> bool:
        return bool(self.schema_file or self.registry)


def _format(value: Any) -> Any:
    return {"type": value} if isinstance(value, str) else value


Format = Annotated[FormatConfig, BeforeValidator(_format, json_schema_input_type=FormatType | FormatConfig)]

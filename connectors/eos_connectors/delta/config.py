"""The Delta Lake sink's section of a pipeline file (`delta:` in a sink entry).

    sinks:
      - name: clicks_lake
        input: clicks
        delta:
          table: /data/lake/clicks               # a local path (relative: to the pipeline file's
                                                 # folder), file://, s3://bucket/path, az://, gs://
          mode: upsert                           # append (default) | upsert (a Delta MERGE by key)
          key: [campaign_id, window_start]       # upsert: one row per key per epoch
          partition_by: [day]                    # the table's partition columns (create_table)
          create_table: true                     # create it from the rows' schema when missing
          columns:                               # optional: name -> SQL expression over the input
            campaign_id: campaign_id
            window_start: window.start
          storage_options:                       # passed to delta-rs's object store; secrets via ${VAR}
            AWS_ENDPOINT_URL: http://127.0.0.1:9000
            AWS_SECRET_ACCESS_KEY: ${S3_SECRET}

Column names are taken literally, case included.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from eos.api import SECRET_KEY, SINK_NAME, VIEW, Model, SinkEntry

# Key columns appear in the MERGE predicate that delta-rs parses: plain identifiers only.
KEY_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Storage options whose values may be credentials (besides eos's usual secret-looking keys).
_SECRET_OPTION = re.compile(r"(?i)(key|sas|signature|session)")


def secret_option(name: str) -> bool:
    return bool(SECRET_KEY.search(name) or _SECRET_OPTION.search(name))


class DeltaSinkSection(Model):
    table: str = Field(min_length=1)  # a path or URI that delta-rs opens
    mode: Literal["append", "upsert"] = "append"
    key: list[str] | None = Field(None, min_length=1)
    partition_by: list[str] | None = Field(None, min_length=1)
    create_table: bool = False
    columns: dict[str, str] | None = Field(None, min_length=1)  # ordered: name -> SQL expression
    storage_options: dict[str, str] = Field(default_factory=dict)

    @field_serializer("storage_options")
    def _masked(self, options: dict[str, str]) -> dict[str, str]:
        """Whatever shows the config (`eos validate --json`, logs) gets credentials masked; the
        connector reads the attribute itself."""
        return {k: ("***" if secret_option(k) else v) for k, v in options.items()}

    @field_validator("storage_options")
    @classmethod
    def _conditional_put(cls, options: dict[str, str]) -> dict[str, str]:
        """delta-rs creates each log entry with a conditional PUT (put-if-absent); switched off, it
        can neither create a table on S3 nor commit to one (docs/DELTA.md, "Tables on S3")."""
        for name, value in options.items():
            if name.lower().removeprefix("aws_") == "conditional_put" and value.strip().lower() == "disabled":
                raise ValueError(
                    f"storage_options {name}: disabled: delta-rs commits a version with a conditional PUT (create "
                    "only if absent), and with it disabled cannot commit to a table on S3; leave the option out: by "
                    "default delta-rs uses the store's conditional writes (If-None-Match), as S3 has had since 2024"
                )
        return options

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        _, separator, rest = table.partition("://")
        authority = rest.split("/", 1)[0]
        if separator and ":" in authority.rpartition("@")[0]:  # user:password@host (abfss's container@account is fine)
            raise ValueError("put credentials in `storage_options` (from ${VAR}), not in the table's URI")
        return table

    @field_validator("key", "partition_by")
    @classmethod
    def _names(cls, names: list[str] | None) -> list[str] | None:
        if names is not None:
            if len(set(names)) != len(names):
                raise ValueError("a column is listed twice")
            for name in names:
                _check_column(name)
        return names

    @field_validator("key")
    @classmethod
    def _key(cls, key: list[str] | None) -> list[str] | None:
        for name in key or []:
            if not KEY_COLUMN.match(name):
                raise ValueError(f"key column {name!r}: letters, digits and _ only (it goes into the MERGE predicate)")
        return key

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        for name, expression in (columns or {}).items():
            _check_column(name)
            if not str(expression).strip():
                raise ValueError(f"column {name!r}: empty SQL expression")
        return columns

    @model_validator(mode="after")
    def _mode(self) -> DeltaSinkSection:
        if self.mode == "upsert" and not self.key:
            raise ValueError("mode: upsert needs `key: [columns]`: the MERGE matches rows by it")
        if self.mode == "append" and self.key:
            raise ValueError("`key` is what mode: upsert matches rows by; append mode has none")
        if self.columns is not None:
            for what, names in (("key", self.key), ("partition_by", self.partition_by)):
                missing = [n for n in names or [] if n not in self.columns]
                if missing:
                    raise ValueError(f"{what} columns {missing} are not among `columns`")
        return self


def _check_column(name: str) -> None:
    if not name or not name.strip() or any(c in name for c in ",;{}()\n\t=`"):
        raise ValueError(f"column {name!r}: a Delta column name, without ,;{{}}()=` or control characters")
    if name.startswith("_eos_"):
        raise ValueError(f"column {name!r}: names starting with _eos_ are eos's own")


class DeltaSinkEntry(SinkEntry):
    name: str = Field(pattern=SINK_NAME)
    input: str | None = Field(None, pattern=VIEW)
    delta: DeltaSinkSection

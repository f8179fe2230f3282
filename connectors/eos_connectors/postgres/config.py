"""The PostgreSQL sink's section of a pipeline file (`postgres:` in a sink entry).

    sinks:
      - name: counts_db
        input: campaign_counts
        postgres:
          dsn: host=db.internal dbname=ads user=eos password=${PG_PASSWORD}
          table: reporting.campaign_counts     # optionally schema-qualified
          mode: upsert                         # append (default) | upsert
          key: [campaign_id, window_start]     # upsert: the conflict target (a unique index)
          create_table: true                   # create it from the view's schema when missing
          columns:                             # optional: name -> SQL expression over the input
            campaign_id: campaign_id
            window_start: window.start
          ledger_table: eos_ledger             # default
          lock_timeout: 10s                    # default

Identifiers are taken literally (they are always quoted in SQL): `Counts` and `counts` are two
tables, as they are for `CREATE TABLE "Counts"`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from eos.api import SINK_NAME, VIEW, Duration, Model, SinkEntry

# An identifier eos writes: no quotes, no dots (a dot separates the schema), at most 63 bytes
# (PostgreSQL's NAMEDATALEN - 1: longer names would be truncated silently).
IDENTIFIER = r'^[^."\x00]{1,63}$'
QUALIFIED = r'^([^."\x00]{1,63}\.)?[^."\x00]{1,63}$'


class PostgresSinkSection(Model):
    dsn: str = Field(min_length=1)  # a libpq connection string or URI; secrets via ${VAR}
    table: str = Field(pattern=QUALIFIED)
    mode: Literal["append", "upsert"] = "append"
    key: list[str] | None = Field(None, min_length=1)
    create_table: bool = False
    columns: dict[str, str] | None = Field(None, min_length=1)  # ordered: name -> SQL expression
    ledger_table: str = Field("eos_ledger", pattern=QUALIFIED)
    lock_timeout: Duration = 10.0  # SET LOCAL lock_timeout of every slot transaction

    @field_serializer("dsn")
    def _masked(self, dsn: str) -> str:
        """Whatever shows the config (`eos validate --json`, logs) gets the DSN with its secrets
        masked; the connector reads the attribute itself."""
        from eos_connectors.postgres.db import masked_dsn

        return masked_dsn(dsn)

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, dsn: str) -> str:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(dsn)
        except ProgrammingError:  # its message may quote the DSN: never shown
            raise ValueError(
                "not a libpq connection string ('host=... dbname=... user=...') or URI ('postgresql://...')"
            ) from None
        return dsn

    @field_validator("key")
    @classmethod
    def _key(cls, key: list[str] | None) -> list[str] | None:
        if key is not None:
            if len(set(key)) != len(key):
                raise ValueError("a key column is listed twice")
            for name in key:
                _check_identifier(name, "key column")
        return key

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        for name, expression in (columns or {}).items():
            _check_identifier(name, "column")
            if not str(expression).strip():
                raise ValueError(f"column {name!r}: empty SQL expression")
        return columns

    @field_validator("lock_timeout")
    @classmethod
    def _lock_timeout(cls, seconds: float) -> float:
        if seconds <= 0:
            raise ValueError("lock_timeout must be positive (a slot must never wait forever on a lock)")
        return seconds

    @model_validator(mode="after")
    def _mode(self) -> PostgresSinkSection:
        if self.mode == "upsert" and not self.key:
            raise ValueError("mode: upsert needs `key: [columns]`, the conflict target (a unique index or primary key)")
        if self.mode == "append" and self.key:
            raise ValueError("`key` is the conflict target of mode: upsert; append mode has none")
        if self.columns is not None and self.key:
            missing = [k for k in self.key if k not in self.columns]
            if missing:
                raise ValueError(f"key columns {missing} are not among `columns`")
        if self.table == self.ledger_table:  # `t` vs `public.t`: compared by OID when the sink is checked
            raise ValueError("the sink's table and its ledger_table must differ")
        return self


def _check_identifier(name: str, what: str) -> None:
    import re

    if not re.match(IDENTIFIER, name) or len(name.encode()) > 63:
        raise ValueError(f"{what} {name!r}: 1 to 63 characters, no quotes or dots")
    if name.startswith("_eos_"):
        raise ValueError(f"{what} {name!r}: names starting with _eos_ are eos's own")


class PostgresSinkEntry(SinkEntry):
    name: str = Field(pattern=SINK_NAME)
    input: str | None = Field(None, pattern=VIEW)
    postgres: PostgresSinkSection

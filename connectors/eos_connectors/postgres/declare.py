"""The PostgreSQL sink of the Python API: `postgres.Sink(...)` builds the same typed entry a
pipeline file's `postgres:` section gives (eos_connectors.postgres.config)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from eos_connectors.declare import entry
from eos_connectors.postgres.config import PostgresSinkEntry


def Sink(
    name: str,
    *,
    dsn: str,
    table: str,
    mode: Literal["append", "upsert"] = "append",
    key: Sequence[str] | None = None,
    create_table: bool = False,
    columns: Mapping[str, str] | None = None,
    ledger_table: str | None = None,
    lock_timeout: str | float | None = None,
) -> PostgresSinkEntry:
    """A PostgreSQL sink: each slot's rows and its ledger row in one transaction, prepared
    (PREPARE TRANSACTION) and committed by the driver with the epoch (docs/POSTGRES.md).
    `mode="upsert"` needs `key`, the conflict target; `columns`: name -> SQL expression over the
    rows (default: the rows' columns)."""
    section = {
        "dsn": dsn,
        "table": table,
        "mode": mode,
        "key": list(key) if key is not None else None,
        "create_table": create_table,
        "columns": dict(columns) if columns is not None else None,
        "ledger_table": ledger_table,
        "lock_timeout": lock_timeout,
    }
    return entry(
        PostgresSinkEntry,
        f"postgres.Sink({name!r})",
        {"name": name, "postgres": {k: v for k, v in section.items() if v is not None}},
    )

"""The ledger table: one row per (pipeline, sink, slot), the slot's last committed epoch.

A slot upserts its row in the transaction that carries its rows, and prepares both at once, so
the row is visible exactly when the rows are (eos.protocol.ledger). Every LedgerEntry field is
stored, plus the gid of the prepared transaction that wrote it: `commit` uses it to tell "already
committed" from "gone" when COMMIT PREPARED finds no such gid.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import sql

from eos.api import ConfigError, LedgerEntry
from eos_connectors.postgres.db import regclass, table_columns, table_name

COLUMNS: dict[str, str] = {
    "pipeline": "text NOT NULL",
    "sink": "text NOT NULL",
    "slot": "integer NOT NULL",
    "epoch": "bigint NOT NULL",
    "checkpoint": "text NOT NULL",
    "offsets": "text NOT NULL",
    "config": "text NOT NULL",
    "attempt": "integer NOT NULL",
    "run": "text NOT NULL",
    "records": "bigint NOT NULL",
    "written_at": "timestamptz NOT NULL",
    "extra": "jsonb NOT NULL DEFAULT '{}'",
    "gid": "text NOT NULL",
}


def ensure(conn: psycopg.Connection, ledger: str) -> None:
    """Create the ledger table if missing; refuse one that lacks a column eos writes."""
    ident = table_name(ledger)
    oid = regclass(conn, ledger)
    if oid is None:
        body = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in COLUMNS.items())
        try:
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY (pipeline, sink, slot))").format(ident, body)
            )
        except psycopg.errors.UniqueViolation:
            pass  # created by another pipeline at the same moment
        except psycopg.Error as exc:
            raise ConfigError(f"cannot create the ledger table {ledger}: {exc}".splitlines()[0]) from None
        oid = regclass(conn, ledger)
        assert oid is not None
    missing = [name for name in COLUMNS if name not in table_columns(conn, oid)]
    if missing:
        raise ConfigError(
            f"the table {ledger} is not an eos ledger table (it has no column {', '.join(missing)})",
            hint="name another table in the sink's `ledger_table`",
        )


def upsert(conn: psycopg.Connection, ledger: str, entry: LedgerEntry, gid: str) -> None:
    names = list(COLUMNS)
    values = [
        entry.pipeline, entry.sink, entry.slot, entry.epoch, entry.checkpoint, entry.offsets, entry.config,
        entry.attempt, entry.run, entry.records, datetime.fromtimestamp(entry.written_at or 0, timezone.utc),
        json.dumps(entry.extra), gid,
    ]  # fmt: skip
    keys = ("pipeline", "sink", "slot")
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (pipeline, sink, slot) DO UPDATE SET {}").format(
        table_name(ledger),
        sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder() * len(names)),
        sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n)) for n in names if n not in keys
        ),
    )
    conn.execute(query, values)


def _entry(row: dict[str, Any]) -> LedgerEntry:
    extra = row["extra"] if isinstance(row["extra"], dict) else json.loads(row["extra"] or "{}")
    return LedgerEntry(
        pipeline=row["pipeline"], sink=row["sink"], slot=row["slot"], epoch=row["epoch"], checkpoint=row["checkpoint"],
        offsets=row["offsets"], config=row["config"], attempt=row["attempt"], run=row["run"], records=row["records"],
        written_at=row["written_at"].timestamp(), extra=extra,
    )  # fmt: skip


def read(conn: psycopg.Connection, ledger: str, pipeline: str, sinks: list[str]) -> dict[tuple[str, int], LedgerEntry]:
    """The committed rows of these sinks of `pipeline` (a missing ledger table holds none)."""
    if regclass(conn, ledger) is None:
        return {}
    query = sql.SQL("SELECT * FROM {} WHERE pipeline = %s AND sink = ANY(%s)").format(table_name(ledger))
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(query, [pipeline, sinks]).fetchall()
    return {(row["sink"], row["slot"]): _entry(row) for row in rows}


def committed_gid(conn: psycopg.Connection, ledger: str, pipeline: str, sink: str, slot: int) -> str | None:
    """The gid of the transaction that wrote the slot's committed ledger row."""
    query = sql.SQL("SELECT gid FROM {} WHERE pipeline = %s AND sink = %s AND slot = %s").format(table_name(ledger))
    row = conn.execute(query, [pipeline, sink, slot]).fetchone()
    return row[0] if row else None


def delete_pipeline(conn: psycopg.Connection, ledger: str, pipeline: str) -> int:
    """The demo's reset: forget the pipeline's rows."""
    if regclass(conn, ledger) is None:
        return 0
    return conn.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s").format(table_name(ledger)), [pipeline]).rowcount


def delete_sink(conn: psycopg.Connection, ledger: str, pipeline: str, sink: str) -> int:
    """`eos reset`: forget one sink's rows."""
    if regclass(conn, ledger) is None:
        return 0
    query = sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s").format(table_name(ledger))
    return conn.execute(query, [pipeline, sink]).rowcount

"""PostgreSQL plumbing of the sink: connections (never showing the DSN's secrets), errors, names,
types, and Arrow batches as COPY input."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from eos.api import ConfigError, EnvironmentProblem, Permanent, SlotAborted, redacted

APPLICATION = "eos"


# ---------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------


def dsn_fields(dsn: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # The parser's message may quote the string: never show it.
        raise ConfigError(f"the PostgreSQL dsn is not a valid libpq connection string ({type(exc).__name__})") from None


def where(dsn: str) -> str:
    """host:port/dbname as user: what a message may say about a DSN."""
    fields = dsn_fields(dsn)
    host = fields.get("host") or fields.get("hostaddr") or "localhost"
    port = fields.get("port") or "5432"
    user = f" as {fields['user']}" if fields.get("user") else ""
    return f"{host}:{port}/{fields.get('dbname') or fields.get('user') or '?'}{user}"


def masked(dsn: str) -> dict[str, Any]:
    """The DSN's fields with secrets masked (password, sslpassword...)."""
    return redacted(dsn_fields(dsn))


def masked_dsn(dsn: str) -> str:
    """The DSN as a connection string with its secrets masked (or a placeholder if it does not parse)."""
    from psycopg.conninfo import make_conninfo

    try:
        return make_conninfo(**masked(dsn))
    except (ConfigError, psycopg.Error):
        return "(an unparsable dsn)"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def connect(dsn: str, role: str) -> psycopg.Connection:
    """An autocommit connection: BEGIN, PREPARE TRANSACTION and COMMIT PREPARED are sent exactly
    as written. Raises SlotAborted (a server restarting: recovery and the epoch are retried),
    naming the server, never the DSN."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10, application_name=f"{APPLICATION}-{role}")
    except psycopg.Error as exc:
        raise SlotAborted(f"cannot connect to PostgreSQL at {where(dsn)}: {first_line(exc)}") from None


def unreachable(exc: SlotAborted) -> EnvironmentProblem:
    """At start-up, a server that does not answer is the user's to fix, not a retry's."""
    text = exc.message
    if re.search(r"SSL|certificate|TLS", text):
        hint = (
            "the TLS connection failed: with sslmode=verify-ca or verify-full the server's certificate must be signed "
            "by a CA in the dsn's sslrootcert (a PEM file the driver and every executor can read), and with "
            "verify-full it must also name the dsn's host (see docs/POSTGRES.md, TLS)"
        )
    elif "password authentication failed" in text or "no pg_hba.conf entry" in text:
        hint = (
            "the server refused the dsn's role or password: after a password change, give the pipeline the new one "
            "(the ${VAR} its dsn names); prepared transactions belong to the role, not the password"
        )
    else:
        hint = "is the server running, and does the sink's dsn name it?"
    return EnvironmentProblem(text, hint=hint)


def sqlstate(exc: BaseException) -> str:
    return getattr(exc, "sqlstate", None) or ""


UNDEFINED_OBJECT = "42704"  # COMMIT/ROLLBACK PREPARED of a gid that is not prepared (any more)
# Classes whose errors the same rows would raise again on every replay: data exceptions,
# integrity constraint violations, syntax errors or access rule violations, feature not supported.
_PERMANENT_CLASSES = ("22", "23", "42", "0A")


def slot_error(exc: BaseException, what: str) -> Exception:
    """The typed error of a failed slot statement: permanent for data that cannot go in (a replay
    would fail the same way), retriable for everything else (a lock timeout, a lost connection)."""
    state = sqlstate(exc)
    message = f"{what}: {first_line(exc)}" + (f" (SQLSTATE {state})" if state else "")
    if state[:2] in _PERMANENT_CLASSES:
        return Permanent(message, hint="fix the rows (or the table) and run again: the epoch is replayed as it was")
    return SlotAborted(message)


# ---------------------------------------------------------------------------------------------
# Names and types
# ---------------------------------------------------------------------------------------------


def table_name(qualified: str) -> sql.Identifier:
    return sql.Identifier(*qualified.split("."))


def schema_of(qualified: str) -> str | None:
    return qualified.split(".")[0] if "." in qualified else None


def regclass(conn: psycopg.Connection, qualified: str) -> int | None:
    """The table's OID (following the search path for an unqualified name), None if missing."""
    text = table_name(qualified).as_string(conn)
    row = conn.execute("SELECT to_regclass(%s)::oid", [text]).fetchone()
    return row[0] if row and row[0] is not None else None


def require_privileges(conn: psycopg.Connection, oid: int, table: str, privileges: list[str], why: str) -> None:
    """ConfigError unless the connecting role holds `privileges` on the table: found at start-up,
    not in the first epoch (a role changed in the dsn lacks the grants the old role had)."""
    rows = conn.execute(
        "SELECT p FROM unnest(%s::text[]) AS p WHERE NOT has_table_privilege(%s::oid, p)", [privileges, oid]
    ).fetchall()
    missing = [row[0] for row in rows]
    if missing:
        role = conn.info.user
        raise ConfigError(
            f"the role {role} lacks {', '.join(missing)} on {table}, which {why} needs",
            hint=f"GRANT {', '.join(missing)} ON {table} TO {role} (as the table's owner or a superuser: a table eos "
            "created belongs to the role it connected as then)",
        )


def table_columns(conn: psycopg.Connection, oid: int) -> dict[str, str]:
    """name -> SQL type of a table's columns, in order."""
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [oid],
    ).fetchall()
    return {name: kind for name, kind in rows}


def unique_keys(conn: psycopg.Connection, oid: int) -> list[set[str]]:
    """The column sets of the table's unique indexes (plain columns, no predicate): what
    `ON CONFLICT (columns)` can infer."""
    rows = conn.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL "
        "GROUP BY i.indexrelid",
        [oid],
    ).fetchall()
    return [set(row[0]) for row in rows]


def sql_type(spark_type: Any) -> str:
    """The column type `create_table` gives a Spark type."""
    from pyspark.sql import types as T

    simple = {
        T.StringType: "text", T.BooleanType: "boolean", T.ByteType: "smallint", T.ShortType: "smallint",
        T.IntegerType: "integer", T.LongType: "bigint", T.FloatType: "real", T.DoubleType: "double precision",
        T.DateType: "date", T.TimestampType: "timestamptz", T.TimestampNTZType: "timestamp", T.BinaryType: "bytea",
    }  # fmt: skip
    for kind, name in simple.items():
        if isinstance(spark_type, kind):
            return name
    if isinstance(spark_type, T.DecimalType):
        return f"numeric({spark_type.precision},{spark_type.scale})"
    if isinstance(spark_type, (T.ArrayType, T.MapType, T.StructType)):
        return "jsonb"  # written as JSON (see csv_bytes)
    return "text"


# ---------------------------------------------------------------------------------------------
# Arrow -> COPY (FORMAT csv)
# ---------------------------------------------------------------------------------------------


def _to_text(values: list[Any], convert: Any) -> Any:
    import pyarrow as pa

    return pa.array([None if v is None else convert(v) for v in values], pa.string())


def copy_ready(batch: Any) -> Any:
    """The batch with every column in a form whose CSV text PostgreSQL reads back exactly:
    timestamps with a zone in UTC (`...Z`), binary as bytea hex (`\\x...`), nested values as
    JSON. Everything else is written by Arrow's CSV writer as it is."""
    import pyarrow as pa

    arrays = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        kind = field.type
        if pa.types.is_dictionary(kind):
            column = column.cast(kind.value_type)
            kind = kind.value_type
        if pa.types.is_timestamp(kind) and kind.tz is not None and kind.tz not in ("UTC", "+00:00"):
            column = column.cast(pa.timestamp(kind.unit, tz="UTC"))
        elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
            column = _to_text(column.to_pylist(), lambda v: "\\x" + bytes(v).hex())
        elif pa.types.is_nested(kind):
            column = _to_text(column.to_pylist(), lambda v: json.dumps(v, default=str, separators=(",", ":")))
        elif pa.types.is_null(kind):
            column = pa.nulls(len(column), pa.string())
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def csv_bytes(batch: Any) -> bytes:
    """COPY ... (FORMAT csv) input: unquoted empty fields are NULL, strings are always quoted (so
    an empty string stays one)."""
    import pyarrow.csv as pacsv

    out = io.BytesIO()
    pacsv.write_csv(copy_ready(batch), out, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return out.getvalue()

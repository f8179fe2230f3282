"""The PostgreSQL sink: two-phase commit with PREPARE TRANSACTION (Recovery.RESUME).

Per slot and epoch attempt, in a Spark task (a Python worker keeps one idle connection per DSN
between tasks):

    BEGIN
    SET LOCAL lock_timeout = ...          a zombie's locks fail the slot instead of hanging it
    COPY table (columns) FROM STDIN         append; upsert: COPY into the sink's staging table,
                                            then INSERT INTO table SELECT DISTINCT ON (key) ...
                                            ON CONFLICT (key) DO UPDATE, and DELETE the staged rows
    INSERT INTO eos_ledger ... ON CONFLICT (pipeline, sink, slot) DO UPDATE    the slot's entry
    PREPARE TRANSACTION 'eos/<pipeline>/<checkpoint>/<sink>/<slot>/<epoch>/<attempt>/<task>/<run>'

The prepared transaction is durable (it survives kill -9 of everything, the server's too) and
invisible; the session is free again at once. The gid travels to the driver in the slot's report.
Once every slot has pre-committed and the driver has recorded its decision, the driver commits:
`COMMIT PREPARED` from its own connection. After a crash, recovery (before any epoch runs)
commits exactly the prepared transactions of the recorded decision and rolls back every other
one of this pipeline (`resolve`), then reads the ledger table: a slot whose row shows the pending
epoch writes nothing when the epoch is replayed.

Why upsert stages rows in a regular (unlogged) table: PostgreSQL refuses to PREPARE a transaction
that touched a temporary table. The staging table `eos_stage_<digest>` (next to the target, one per
sink and column layout) only ever holds rows of open transactions: each slot deletes its own rows
in the transaction that staged them, so every committed state of it is empty.

At-least-once mode: the same transaction without the ledger row, committed at once (COMMIT).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from eos.api import (
    ConfigError,
    Decision,
    Ledger,
    LedgerEntry,
    Permanent,
    PipelineInfo,
    Prepared,
    Recovery,
    SinkConnector,
    SlotAborted,
    SlotContext,
    SlotWriter,
    WriterFactory,
)
from eos_connectors.postgres import ids, ledger
from eos_connectors.postgres.config import PostgresSinkEntry
from eos_connectors.postgres.db import (
    UNDEFINED_OBJECT,
    connect,
    csv_bytes,
    first_line,
    regclass,
    require_privileges,
    slot_error,
    sql_type,
    sqlstate,
    table_columns,
    table_name,
    unique_keys,
    unreachable,
    where,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("eos.postgres")

SLOT_COLUMN = "_eos_slot"
SEQ_COLUMN = "_eos_seq"


@dataclass(frozen=True)
class PreparedXact:
    gid: str
    owner: str | None  # the role that prepared it (None: that role was dropped since)
    age_s: float

    def finishers(self) -> str:
        """Who PostgreSQL lets COMMIT or ROLLBACK PREPARED it: the role that prepared it, or a
        superuser (role membership is not enough)."""
        return f"only {self.owner} or a superuser" if self.owner else "only a superuser (its role no longer exists)"


def prepared_xacts(conn: psycopg.Connection, pipeline: str) -> list[PreparedXact]:
    """This pipeline's prepared transactions in the connection's database, oldest first."""
    prefix = ids.pipeline_prefix(pipeline)
    rows = conn.execute(
        "SELECT gid, owner, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
        "WHERE database = current_database() AND left(gid, %s) = %s ORDER BY prepared",
        [len(prefix), prefix],
    ).fetchall()
    return [PreparedXact(gid, owner, float(age)) for gid, owner, age in rows]


def finish(conn: psycopg.Connection, gid: str, commit: bool) -> bool:
    """COMMIT or ROLLBACK PREPARED; False if no such gid is prepared (any more)."""
    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    try:
        conn.execute(sql.SQL(verb).format(sql.Literal(gid)))
        return True
    except psycopg.Error as exc:
        if sqlstate(exc) == UNDEFINED_OBJECT:
            return False
        raise


def decided(decision: Decision | None, gid: str) -> bool:
    """Whether the recorded decision commits `gid` (under whichever sink name it was decided)."""
    return decision is not None and any(decision.commits(sink, gid) for sink in decision.prepared)


def finisher(connections: dict[str, psycopg.Connection], owner: str | None) -> psycopg.Connection | None:
    """A connection that may finish a prepared transaction of `owner`: one as that role, else a
    superuser's; None when there is neither."""
    if owner in connections:
        return connections[owner]
    return next((c for c in connections.values() if c.info.parameter_status("is_superuser") == "on"), None)


class StrandedPrepared(Permanent):
    """Prepared transactions of the pipeline that none of its connections may finish."""


def stranded_error(
    stranded: list[PreparedXact], connections: dict[str, psycopg.Connection], pipeline: str, decision: Decision | None
) -> StrandedPrepared:
    conn = next(iter(connections.values()))
    database = f"database {conn.info.dbname} at {conn.info.host}:{conn.info.port}"
    lines = [
        f"  {x.gid}: prepared {x.age_s:.0f} s ago by role {x.owner or '(dropped)'} in {database}: {x.finishers()} "
        f"may finish it; the recorded decision says {'COMMIT' if decided(decision, x.gid) else 'ROLLBACK'} "
        f"PREPARED '{x.gid}'"
        for x in stranded
    ]
    owners = sorted({x.owner for x in stranded if x.owner})
    return StrandedPrepared(
        f"pipeline {pipeline}: {len(stranded)} of its prepared transactions cannot be resolved: the pipeline connects "
        f"as {', '.join(sorted(connections))}, which is not the role that prepared them nor a superuser, and "
        "PostgreSQL lets no one else COMMIT or ROLLBACK PREPARED them. Until they are resolved they hold their locks "
        "(the next epoch's slots would fail on them) and keep VACUUM from removing old rows. Nothing was changed.\n"
        + "\n".join(lines),
        hint=(f"give the sink's dsn the role {' or '.join(owners)} again until one start (or `eos postgres cleanup`) "
              "has resolved them, or have " + (f"{' or '.join(owners)} or " if owners else "")
              + "a superuser run the statements above in that database; then change the role"),
    )  # fmt: skip


def resolve_prepared(
    connections: dict[str, psycopg.Connection], pipeline: str, decision: Decision | None
) -> list[tuple[str, str]]:
    """Commit the pipeline's prepared transactions that `decision` commits, roll back every other
    one; `connections` by role: each transaction is finished as the role that prepared it, or as a
    superuser. If any can be finished by none of them, nothing is done (StrandedPrepared).
    Returns (gid, "committed" | "rolled back" | "gone") in order."""
    xacts = prepared_xacts(next(iter(connections.values())), pipeline)
    stranded = [x for x in xacts if finisher(connections, x.owner) is None]
    if stranded:
        raise stranded_error(stranded, connections, pipeline, decision)
    done = []
    for xact in xacts:
        commit = decided(decision, xact.gid)
        found = finish(finisher(connections, xact.owner), xact.gid, commit)  # type: ignore[arg-type]
        done.append((xact.gid, ("committed" if commit else "rolled back") if found else "gone"))
    return done


class PostgresSink(SinkConnector):
    kind = "postgres"
    entry_model = PostgresSinkEntry
    recovery = Recovery.RESUME
    reach_settings = ("dsn", "lock_timeout", "create_table")  # the DSN may hold a password
    entry: PostgresSinkEntry

    def __init__(self, entry: PostgresSinkEntry, pipeline: PipelineInfo, view: str | None = None):
        super().__init__(entry, pipeline)
        self._conn: psycopg.Connection | None = None
        self._system: str | None = None
        self._columns: tuple[str, ...] | None = None  # set by rows()
        self._stage: str | None = None
        self._lock = threading.Lock()

    @property
    def section(self):
        return self.entry.postgres

    # -- identity ----------------------------------------------------------------------------
    def describe(self) -> str:
        s = self.section
        how = f"upsert on ({', '.join(s.key or [])})" if s.mode == "upsert" else "append"
        return (
            f"table {s.table} @ {where(s.dsn)} ({how}), ledger table {s.ledger_table}, prepared transactions "
            f"{ids.pipeline_prefix(self.pipeline.name)}..."
        )

    def system(self) -> str:
        if self._system is None:
            conn = self.connection()
            allowed = conn.execute("SELECT has_function_privilege('pg_control_system()', 'EXECUTE')").fetchone()[0]
            if allowed:
                sysid = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
            else:  # some managed services hide it: the server's address then
                sysid = conn.execute(
                    "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')"
                ).fetchone()[0]
            database = conn.execute("SELECT current_database()").fetchone()[0]
            self._system = f"postgres {sysid}/{database}"
        return self._system

    # -- the driver's connection ---------------------------------------------------------------
    def connection(self) -> psycopg.Connection:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.section.dsn, "driver")
            return self._conn

    def _reset(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._reset()

    # -- checks ------------------------------------------------------------------------------
    def check(self, spark: Any) -> None:
        try:
            conn = self.connection()
        except SlotAborted as exc:
            raise unreachable(exc) from None
        if not self.pipeline.exactly_once:
            return
        limit = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
        if limit <= 0:
            raise ConfigError(
                f"sink {self.name}: the PostgreSQL server at {where(self.section.dsn)} has max_prepared_transactions "
                "= 0, so it refuses PREPARE TRANSACTION, which exactly-once writes need",
                hint="set max_prepared_transactions in postgresql.conf (or ALTER SYSTEM SET max_prepared_transactions "
                "= 64) to at least the number of slots writing to it at once plus a few, and restart the server "
                "(the setting needs a restart); or use `epochs.mode: at-least-once`",
            )
        ledger.ensure(conn, self.section.ledger_table)
        oid = regclass(conn, self.section.ledger_table)
        assert oid is not None
        require_privileges(
            conn, oid, self.section.ledger_table, ["SELECT", "INSERT", "UPDATE"], f"sink {self.name}'s ledger"
        )

    # -- rows and writers ----------------------------------------------------------------------
    def rows(self, view: DataFrame) -> DataFrame:
        columns = self.section.columns
        if columns:
            projected = view.selectExpr(
                *(f"{expression} AS {_backquote(name)}" for name, expression in columns.items())
            )
        else:
            projected = view.select(*_flattened(view.schema, self.name))
        self._prepare_table(projected.schema)
        return projected

    def _prepare_table(self, schema: Any) -> None:
        """Check the table (or create it) against the rows' columns; make the staging table."""
        s = self.section
        names = [f.name for f in schema.fields]
        for name in names:
            if len(name.encode()) > 63:
                raise ConfigError(
                    f"sink {self.name}: column {name!r} is longer than PostgreSQL's 63 bytes",
                    hint="name the columns with `columns:` (name: SQL expression)",
                )
        if s.mode == "upsert" and set(s.key or []) - set(names):
            absent = [k for k in s.key or [] if k not in names]
            raise ConfigError(
                f"sink {self.name}: upsert key {', '.join(repr(k) for k in absent)} is not a column of the sink's rows "
                f"({', '.join(names)})",
                hint="select it in the sink's input (for a window: `window.start AS window_start`), or change `key:`",
            )
        conn = self.connection()
        oid = regclass(conn, s.table)
        if oid is None:
            if not s.create_table:
                raise ConfigError(
                    f"sink {self.name}: table {s.table} does not exist at {where(s.dsn)}",
                    hint="create it, or set `create_table: true` in the sink's postgres section",
                )
            definitions = [
                sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(sql_type(f.dataType))) for f in schema.fields
            ]
            if s.mode == "upsert":
                definitions.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, s.key))))
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    table_name(s.table), sql.SQL(", ").join(definitions)
                )
            )
            # A normal event of a first start, not a warning: said once, on stderr.
            log.info("sink %s: created table %s at %s", self.name, s.table, where(s.dsn))
            print(f"eos: sink {self.name}: created table {s.table}", file=sys.stderr, flush=True)
            oid = regclass(conn, s.table)
            assert oid is not None
        if self.pipeline.exactly_once and regclass(conn, s.ledger_table) == oid:
            raise ConfigError(f"sink {self.name}: the table {s.table} is the ledger table {s.ledger_table}")
        # COPY needs INSERT; INSERT ... ON CONFLICT DO UPDATE needs SELECT and UPDATE too.
        privileges = ["INSERT", "SELECT", "UPDATE"] if s.mode == "upsert" else ["INSERT"]
        require_privileges(conn, oid, s.table, privileges, f"sink {self.name} ({s.mode})")
        existing = table_columns(conn, oid)
        missing = [n for n in names if n not in existing]
        if missing:
            raise ConfigError(
                f"sink {self.name}: table {s.table} has no column {', '.join(repr(m) for m in missing)} "
                f"(its columns: {', '.join(existing)})",
                hint="add the columns to the table, or map the rows onto its columns with `columns:`",
            )
        if s.mode == "upsert":
            if set(s.key or []) - set(names):
                raise ConfigError(f"sink {self.name}: key columns {s.key} are not all among the rows' columns {names}")
            if set(s.key or []) not in unique_keys(conn, oid):
                raise ConfigError(
                    f"sink {self.name}: table {s.table} has no unique index or primary key on exactly "
                    f"({', '.join(s.key or [])}), which `ON CONFLICT` needs as its target",
                    hint=f"CREATE UNIQUE INDEX ON {s.table} ({', '.join(s.key or [])})",
                )
            self._stage = self._ensure_stage(conn, oid, {n: existing[n] for n in names})
        self._columns = tuple(names)

    def _ensure_stage(self, conn: psycopg.Connection, oid: int, columns: dict[str, str]) -> str:
        """The staging table of this sink's layout (a new layout gets a new one: an old one may
        still be in use by a prepared transaction, so none is ever altered or dropped here)."""
        schema = conn.execute(
            "SELECT nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", [oid]
        ).fetchone()[0]
        layout = repr((self.pipeline.name, self.name, self.section.table, sorted(columns.items())))
        stage = f"{schema}.eos_stage_{hashlib.sha256(layout.encode()).hexdigest()[:16]}"
        definitions = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns.items()]
        definitions += [
            sql.SQL("{} integer NOT NULL").format(sql.Identifier(SLOT_COLUMN)),
            sql.SQL("{} bigint NOT NULL").format(sql.Identifier(SEQ_COLUMN)),
        ]
        staged = regclass(conn, stage)
        if staged is not None:  # made earlier, perhaps by another role
            require_privileges(conn, staged, stage, ["SELECT", "INSERT", "DELETE"], f"sink {self.name}'s staging")
        else:
            with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                conn.execute(
                    sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} ({})").format(
                        table_name(stage), sql.SQL(", ").join(definitions)
                    )
                )
            conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(
                    table_name(stage),
                    sql.Literal(
                        f"eos: staged upsert rows of sink {self.name} of pipeline {self.pipeline.name} into "
                        f"{self.section.table}; rows exist only inside open transactions"
                    ),
                )
            )
        return stage

    def writer(self) -> PostgresWriterFactory:
        if self._columns is None:
            raise ConfigError(f"sink {self.name}: writer() before rows(): the table was not checked")
        s = self.section
        return PostgresWriterFactory(
            dsn=s.dsn,
            sink=self.name,
            table=s.table,
            columns=self._columns,
            mode=s.mode,
            key=tuple(s.key or ()),
            stage=self._stage,
            ledger_table=s.ledger_table,
            lock_timeout_ms=max(1, int(s.lock_timeout * 1000)),
            exactly_once=self.pipeline.exactly_once,
        )

    # -- commit and recovery (driver) ------------------------------------------------------------
    def commit(self, prepared: list[Prepared]) -> None:
        """COMMIT PREPARED each; a gid that is no longer prepared is fine if the slot's ledger row
        shows it committed (a commit repeated after its reply was lost)."""
        for p in prepared:
            try:
                conn = self.connection()
                if finish(conn, p.handle, commit=True):
                    continue
                gid = ledger.committed_gid(conn, self.section.ledger_table, self.pipeline.name, p.sink, p.slot)
            except (psycopg.Error, SlotAborted) as exc:
                if isinstance(exc, psycopg.OperationalError):
                    self._reset()
                raise SlotAborted(f"sink {self.name}: COMMIT PREPARED {p.handle} failed: {first_line(exc)}") from None
            if gid != p.handle:
                raise SlotAborted(
                    f"sink {self.name}: prepared transaction {p.handle} is gone and did not commit (the slot's ledger "
                    f"row shows {gid or 'nothing'}): someone rolled it back; the slot's rows are written again"
                )

    def forget(self) -> None:
        """`eos reset`: delete this sink's rows of the ledger table (its table keeps its rows)."""
        ledger.delete_sink(self.connection(), self.section.ledger_table, self.pipeline.name, self.name)

    def discard(self, prepared: list[Prepared]) -> None:
        for p in prepared:
            with contextlib.suppress(psycopg.Error, SlotAborted):
                finish(self.connection(), p.handle, commit=False)

    @classmethod
    def resolve(cls, sinks: list[SinkConnector], decision: Decision | None) -> dict[str, int]:
        """Commit this pipeline's prepared transactions that the recorded decision commits, roll
        back every other one (this database: the sinks share one system)."""
        connections: dict[str, psycopg.Connection] = {}
        for sink in sinks:
            assert isinstance(sink, PostgresSink)
            conn = sink.connection()
            connections.setdefault(conn.info.user, conn)
        first = sinks[0]
        try:
            done = resolve_prepared(connections, first.pipeline.name, decision)
        except psycopg.Error as exc:
            for sink in sinks:
                sink._reset()  # type: ignore[attr-defined]
            raise SlotAborted(
                f"resolving prepared transactions at {where(first.section.dsn)} failed: {first_line(exc)}"
            ) from None
        counts = {"committed": 0, "rolled back": 0}
        for _, what in done:
            if what in counts:
                counts[what] += 1
        if done:
            by = f" (decision: epoch {decision.epoch} attempt {decision.attempt})" if decision else " (no decision)"
            log.warning(
                "pipeline %s: %s: committed %d and rolled back %d prepared transactions left open%s",
                first.pipeline.name, first.system(), counts["committed"], counts["rolled back"], by,
            )  # fmt: skip
        return counts

    @classmethod
    def read_ledger(cls, sinks: list[SinkConnector]) -> Ledger:
        found: Ledger = {}
        by_table: dict[str, list[PostgresSink]] = {}
        for sink in sinks:
            assert isinstance(sink, PostgresSink)
            by_table.setdefault(sink.section.ledger_table, []).append(sink)
        for table, group in by_table.items():
            try:
                found.update(ledger.read(group[0].connection(), table, group[0].pipeline.name, [s.name for s in group]))
            except psycopg.Error as exc:
                group[0]._reset()
                raise SlotAborted(f"reading the ledger table {table} failed: {first_line(exc)}") from None
        return found

    def lingering(self) -> list[str]:
        """This pipeline's prepared transactions in this sink's database, with their age and owner:
        each holds its locks and keeps VACUUM from removing rows older than itself until resolved.
        One this sink's role may not finish is marked STRANDED, with who may."""
        conn = self.connection()
        me = conn.info.user
        found = []
        for x in prepared_xacts(conn, self.pipeline.name):
            line = f"{x.gid}: prepared {x.age_s:.0f} s ago by role {x.owner} in database {conn.info.dbname}"
            line += f" ({self.system()})"
            if finisher({me: conn}, x.owner) is None:
                line += (
                    f"; STRANDED: this sink connects as {me}, which may not finish it: {x.finishers()} may "
                    "(`eos postgres cleanup` says whether to COMMIT or ROLLBACK PREPARED it)"
                )
            found.append(line)
        return found


def _backquote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _flattened(schema: Any, sink: str) -> list[Any]:
    """The view's columns, struct fields as `<struct>_<field>` (Spark's `window` becomes
    window_start, window_end)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    def walk(fields: Any, prefix: tuple[str, ...]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for field in fields:
            path = (*prefix, field.name)
            if isinstance(field.dataType, StructType):
                out += walk(field.dataType.fields, path)
            else:
                out.append(("_".join(path), F.col(".".join(_backquote(p) for p in path))))
        return out

    pairs = walk(schema.fields, ())
    names = [name for name, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"sink {sink}: flattening the input's struct columns gives the column names {twice} twice",
            hint="name the columns with `columns:` (name: SQL expression)",
        )
    return [column.alias(name) for name, column in pairs]


# ---------------------------------------------------------------------------------------------
# Task side: one idle connection per Python worker and DSN
# ---------------------------------------------------------------------------------------------

_idle: dict[str, list[psycopg.Connection]] = {}
_idle_lock = threading.Lock()


def _borrow(dsn: str) -> tuple[psycopg.Connection, bool]:
    """An idle connection of this process (reused: True) or a new one."""
    with _idle_lock:
        pool = _idle.get(dsn, [])
        while pool:
            conn = pool.pop()
            if not conn.closed and not conn.broken:
                return conn, True
    return connect(dsn, "slot"), False


def _give_back(dsn: str, conn: psycopg.Connection) -> None:
    if conn.closed or conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with contextlib.suppress(Exception):
            conn.close()
        return
    with _idle_lock:
        _idle.setdefault(dsn, []).append(conn)


@dataclass(frozen=True)
class PostgresWriterFactory(WriterFactory):
    dsn: str
    sink: str
    table: str
    columns: tuple[str, ...]
    mode: str
    key: tuple[str, ...]
    stage: str | None
    ledger_table: str
    lock_timeout_ms: int
    exactly_once: bool

    def open(self, ctx: SlotContext) -> PostgresWriter:
        return PostgresWriter(self, ctx)

    def __repr__(self) -> str:  # never show the DSN
        return f"PostgresWriterFactory(sink={self.sink!r}, table={self.table!r}, mode={self.mode!r})"


class PostgresWriter(SlotWriter):
    def __init__(self, factory: PostgresWriterFactory, ctx: SlotContext):
        self.factory = factory
        self.ctx = ctx
        self.written = 0
        self.gid: str | None = None
        self.state = "new"  # new -> open -> prepared | committed | done
        self.conn, self.reused = _borrow(factory.dsn)
        try:
            try:
                self._begin()
            except psycopg.OperationalError:
                if not self.reused:
                    raise
                # The idle connection died (a server restart): one new connection, once.
                with contextlib.suppress(Exception):
                    self.conn.close()
                self.conn, self.reused = connect(factory.dsn, "slot"), False
                self._begin()
        except psycopg.Error as exc:
            with contextlib.suppress(Exception):
                self.conn.close()
            raise slot_error(exc, self._what("BEGIN")) from None

    def _what(self, action: str) -> str:
        return f"sink {self.factory.sink} slot {self.ctx.slot}: {action}"

    def _begin(self) -> None:
        self.conn.execute("BEGIN")
        self.state = "open"
        timeout = sql.Literal(f"{self.factory.lock_timeout_ms}ms")
        self.conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(timeout))

    # -- SlotWriter ----------------------------------------------------------------------------
    def write(self, batch: Any) -> None:
        import pyarrow as pa

        f = self.factory
        rows = batch.select(list(f.columns))
        columns = list(f.columns)
        target = f.table
        if f.mode == "upsert":
            n = rows.num_rows
            rows = pa.RecordBatch.from_arrays(
                [*rows.columns, pa.array([self.ctx.slot] * n, pa.int32()),
                 pa.array(range(self.written, self.written + n), pa.int64())],
                names=[*columns, SLOT_COLUMN, SEQ_COLUMN],
            )  # fmt: skip
            columns += [SLOT_COLUMN, SEQ_COLUMN]
            assert f.stage is not None
            target = f.stage
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table_name(target), sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        data = csv_bytes(rows)
        try:
            with self.conn.cursor() as cur, cur.copy(statement) as copy:
                copy.write(data)
        except psycopg.Error as exc:
            raise slot_error(exc, self._what(f"COPY into {target}")) from None
        self.written += batch.num_rows

    def _merge(self) -> None:
        """Upsert: the staged rows into the table (the last of each key wins), then unstage them."""
        f = self.factory
        assert f.stage is not None
        cols = sql.SQL(", ").join(map(sql.Identifier, f.columns))
        keys = sql.SQL(", ").join(map(sql.Identifier, f.key))
        others = [c for c in f.columns if c not in f.key]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
            )
            if others
            else sql.SQL("DO NOTHING")
        )
        merge = sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {stage} WHERE {slot} = %s "
            "ORDER BY {keys}, {seq} DESC ON CONFLICT ({keys}) {action}"
        ).format(
            table=table_name(f.table), cols=cols, keys=keys, stage=table_name(f.stage),
            slot=sql.Identifier(SLOT_COLUMN), seq=sql.Identifier(SEQ_COLUMN), action=action,
        )  # fmt: skip
        unstage = sql.SQL("DELETE FROM {} WHERE {} = %s").format(table_name(f.stage), sql.Identifier(SLOT_COLUMN))
        try:
            self.conn.execute(merge, [self.ctx.slot])
            self.conn.execute(unstage, [self.ctx.slot])
        except psycopg.Error as exc:
            raise slot_error(exc, self._what(f"upsert into {f.table}")) from None

    def precommit(self, entry: LedgerEntry) -> Prepared:
        f = self.factory
        if f.mode == "upsert":
            self._merge()
        if not f.exactly_once:
            try:
                self.conn.execute("COMMIT")
            except psycopg.Error as exc:
                raise slot_error(exc, self._what("COMMIT")) from None
            self.state = "committed"
            self._release()
            return Prepared(f.sink, self.ctx.slot, "", self.written, self.ctx.task_attempt)
        gid = str(ids.Gid(
            self.ctx.pipeline.name, self.ctx.pipeline.checkpoint_id, f.sink, self.ctx.slot, self.ctx.epoch,
            self.ctx.attempt, self.ctx.task_attempt, entry.run,
        ))  # fmt: skip
        try:
            ledger.upsert(self.conn, f.ledger_table, entry, gid)
        except psycopg.Error as exc:
            raise slot_error(exc, self._what(f"ledger row into {f.ledger_table}")) from None
        try:
            self.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        except psycopg.Error as exc:
            raise slot_error(exc, self._what("PREPARE TRANSACTION")) from None
        if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:  # pragma: no cover - defensive
            raise SlotAborted(self._what("PREPARE TRANSACTION left the session in a transaction"))
        self.gid, self.state = gid, "prepared"
        self._release()
        return Prepared(f.sink, self.ctx.slot, gid, self.written, self.ctx.task_attempt)

    def abort(self) -> None:
        """The task failed: roll back what is open; a transaction this writer prepared is rolled
        back too (its slot never reported it, so no decision can include it)."""
        try:
            if self.state == "open" and not self.conn.closed:
                self.conn.execute("ROLLBACK")
            elif self.state == "prepared" and self.gid:
                conn, _ = _borrow(self.factory.dsn)
                try:
                    finish(conn, self.gid, commit=False)
                finally:
                    _give_back(self.factory.dsn, conn)
        except psycopg.Error:
            with contextlib.suppress(Exception):
                self.conn.close()
        finally:
            self.state = "done"
            self._release()

    def _release(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None  # type: ignore[assignment]
            _give_back(self.factory.dsn, conn)

    def records(self) -> int:
        return self.written


__all__ = [
    "PostgresSink", "PostgresWriter", "PostgresWriterFactory", "StrandedPrepared", "prepared_xacts", "resolve_prepared",
]  # fmt: skip

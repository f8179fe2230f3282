"""A PostgreSQL password rotated between a crash and the restart: the restart connects with the new
password and finishes the pending epoch exactly once.

The prepared transactions belong to the role, not to a session or a password, so the same role
with a new password may commit them. The role here has only the privileges an append sink needs
(INSERT on the table; SELECT, INSERT, UPDATE on the ledger table), and the password reaches the
pipeline file through an environment variable, as docs/POSTGRES.md advises.
"""

from __future__ import annotations

import secrets
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from eos_connectors.postgres import ledger
from eos_connectors.postgres.sink import prepared_xacts
from tests.faults.test_postgres_faults import RECORDS, pipeline, resolved, table_ids
from tests.pipelines import eos_subprocess, produce_numbered, write_pipeline
from tests.support_postgres import session_server

PASSWORD_VAR = "EOS_TEST_PG_PASSWORD"


@pytest.mark.slow
def test_a_password_rotated_between_a_crash_and_the_restart(
    bootstrap, new_topic, unique_name, postgres, tmp_path: Path
) -> None:
    source = new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, RECORDS)
    name = unique_name("p")
    role, table, ledger_table = (f"{x}_{uuid.uuid4().hex[:10]}" for x in ("eos_rot", "t", "ledger"))
    old, new = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    admin_dsn = make_conninfo(session_server(postgres).admin_dsn, dbname="eos")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (id text, k text)").format(sql.Identifier(table)))
        ledger.ensure(admin, ledger_table)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(old)))
        admin.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(table), sql.Identifier(role)))
        admin.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(
                sql.Identifier(ledger_table), sql.Identifier(role)
            )
        )
    try:
        dsn = make_conninfo(postgres, user=role, password="PLACEHOLDER").replace("PLACEHOLDER", f"${{{PASSWORD_VAR}}}")
        config = pipeline(name, "pg", bootstrap, source, "", dsn, table, tmp_path / "ck")
        config["sinks"][0]["postgres"].update(create_table=False, ledger_table=ledger_table)
        path = write_pipeline(tmp_path, config)

        # Killed between two slots' commits of epoch 1: slot 0 committed, slot 1 still prepared.
        crashed = eos_subprocess(
            "run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1,slot=0", env={PASSWORD_VAR: old}
        )
        assert crashed.killed and "kill -9 at sink.between_commits" in crashed.output, crashed.output[-3000:]
        with psycopg.connect(admin_dsn) as conn:
            pending = prepared_xacts(conn, name)
        assert pending and {x.owner for x in pending} == {role}, pending

        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(new)))
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(make_conninfo(postgres, user=role, password=old)).close()

        finished = eos_subprocess("run", str(path), "--finish-pending", env={PASSWORD_VAR: new})
        assert finished.returncode == 0, finished.output[-3000:]
        assert resolved(finished.output) == (len(pending), 0), finished.output[-3000:]
        assert new not in finished.output and old not in finished.output
        assert Counter(table_ids(admin_dsn, table)) == Counter(sent) and len(sent) == RECORDS
        with psycopg.connect(admin_dsn) as conn:
            assert prepared_xacts(conn, name) == []
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            for x in prepared_xacts(admin, name):
                admin.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(x.gid)))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))

"""Test support: the PostgreSQL server under test, a real one started by eos_ops.localpg.

Tests never mock PostgreSQL and never skip because no server is around: they start one, on a
free loopback port, with its data in the given (temporary) folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eos_ops.localpg import LocalPostgres, free_port


def start_local_postgres(workdir: Path, **settings: str | int) -> LocalPostgres:
    """A started LocalPostgres in `workdir`/postgres; `settings` override its server settings."""
    server = LocalPostgres(port=free_port(), data_dir=workdir / "postgres", settings=settings)
    server.start(progress=print)
    return server


def start_postgres_under_test(workdir: Path) -> tuple[str, Callable[[], None]]:
    """(dsn of the `eos` role and database, close) for a session-scoped fixture; close stops the server."""
    server = start_local_postgres(workdir)

    def close() -> None:
        server.stop(progress=print)

    return server.dsn, close

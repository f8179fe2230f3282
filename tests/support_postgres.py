"""Test support: the PostgreSQL server under test, a real one started by eos_ops.localpg.

Tests never mock PostgreSQL and never skip because no server is around: they start one, on a
free loopback port, with its data in the given (temporary) folder.

Also: certificates made at test time (`make_ca`, `ServerCertificate`) for the server with TLS.
This is the PostgreSQL tests' own small CA; ops/eos_ops/tls.py (the Kafka certificates) may later
take its place.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eos_ops.localpg import LocalPostgres, ServerTls, free_port

# The servers started by start_postgres_under_test, by their dsn: a test of that function starts
# and closes one of its own while the session's server runs.
_running: dict[str, LocalPostgres] = {}


def start_local_postgres(workdir: Path, tls: ServerTls | None = None, **settings: str | int) -> LocalPostgres:
    """A started LocalPostgres in `workdir`/postgres; `settings` override its server settings."""
    server = LocalPostgres(port=free_port(), data_dir=workdir / "postgres", settings=settings, tls=tls)
    server.start(progress=print)
    return server


def start_postgres_under_test(workdir: Path) -> tuple[str, Callable[[], None]]:
    """(dsn of the `eos` role and database, close) for a session-scoped fixture; close stops the
    server and deletes its cluster (as root it may live outside `workdir`: eos_ops.localpg)."""
    server = start_local_postgres(workdir)
    _running[server.dsn] = server

    def close() -> None:
        _running.pop(server.dsn, None)
        server.remove(progress=print)

    return server.dsn, close


def session_server(dsn: str) -> LocalPostgres:
    """The LocalPostgres behind the session's `postgres` fixture (whose value is `dsn`): for tests
    that need its superuser (roles of their own, say)."""
    assert dsn in _running, "the `postgres` fixture's server is not running"
    return _running[dsn]


# ---------------------------------------------------------------------------------------------
# Certificates
# ---------------------------------------------------------------------------------------------


class CertificateAuthority:
    """A test CA (eos_ops.tls.CertificateAuthority) whose certificate is a file a client's
    `sslrootcert` can name."""

    def __init__(self, folder: Path, name: str = "eos test CA"):
        from eos_ops.tls import CertificateAuthority as Authority

        self.authority = Authority(name, valid_days=1)
        self.name = name
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_file = folder / "ca.crt"
        self.cert_file.write_bytes(self.authority.cert_pem)

    def issue(self, folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> ServerTls:
        """A server certificate for `hosts` (IP addresses and DNS names), signed by this CA."""
        key_pem, cert_pem = self.authority.issue(hosts, hosts[0])
        folder.mkdir(parents=True, exist_ok=True)
        cert_file, key_file = folder / "server.crt", folder / "server.key"
        cert_file.write_bytes(cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key_pem)
        return ServerTls(cert_file, key_file)


def make_ca(folder: Path, name: str = "eos test CA") -> CertificateAuthority:
    """A new CA (EC P-256, valid a day) whose certificate is written to folder/ca.crt."""
    return CertificateAuthority(folder, name)

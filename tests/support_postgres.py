"""Test support: the PostgreSQL server under test, a real one started by eos_ops.localpg.

Tests never mock PostgreSQL and never skip because no server is around: they start one, on a
free loopback port, with its data in the given (temporary) folder.

Also: certificates made at test time (`make_ca`, `ServerCertificate`) for the server with TLS.
This is the PostgreSQL tests' own small CA; ops/eos_ops/tls.py (the Kafka certificates) may later
take its place.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eos_ops.localpg import LocalPostgres, ServerTls, free_port

_session: LocalPostgres | None = None


def start_local_postgres(workdir: Path, tls: ServerTls | None = None, **settings: str | int) -> LocalPostgres:
    """A started LocalPostgres in `workdir`/postgres; `settings` override its server settings."""
    server = LocalPostgres(port=free_port(), data_dir=workdir / "postgres", settings=settings, tls=tls)
    server.start(progress=print)
    return server


def start_postgres_under_test(workdir: Path) -> tuple[str, Callable[[], None]]:
    """(dsn of the `eos` role and database, close) for a session-scoped fixture; close stops the
    server and deletes its cluster (as root it may live outside `workdir`: eos_ops.localpg)."""
    global _session
    server = start_local_postgres(workdir)
    _session = server

    def close() -> None:
        global _session
        _session = None
        server.remove(progress=print)

    return server.dsn, close


def session_server(dsn: str) -> LocalPostgres:
    """The LocalPostgres behind the session's `postgres` fixture (whose value is `dsn`): for tests
    that need its superuser (roles of their own, say)."""
    assert _session is not None and _session.dsn == dsn, "the `postgres` fixture's server is not running"
    return _session


# ---------------------------------------------------------------------------------------------
# Certificates
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertificateAuthority:
    cert_file: Path  # PEM: what a client's sslrootcert names
    key: object  # its private key (cryptography), to sign server certificates
    name: str

    def issue(self, folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> ServerTls:
        """A server certificate for `hosts` (IP addresses and DNS names), signed by this CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        key = _new_key()
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]), ca_cert.subject, key)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())  # type: ignore[arg-type]
        )
        folder.mkdir(parents=True, exist_ok=True)
        cert_file, key_file = folder / "server.crt", folder / "server.key"
        cert_file.write_bytes(_pem(cert))
        key_file.touch(mode=0o600)
        key_file.write_bytes(_pem_key(key))
        return ServerTls(cert_file, key_file)


def make_ca(folder: Path, name: str = "eos test CA") -> CertificateAuthority:
    """A new self-signed CA (EC P-256, valid a day) whose certificate is written to folder/ca.crt."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_file = folder / "ca.crt"
    cert_file.write_bytes(_pem(cert))
    return CertificateAuthority(cert_file, key, name)


def _ca_key_usage():
    from cryptography import x509

    flags = dict.fromkeys(
        ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
         "encipher_only", "decipher_only"),
        False,
    )  # fmt: skip
    return x509.KeyUsage(key_cert_sign=True, crl_sign=True, **flags)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _builder(subject, issuer, key):
    from cryptography import x509

    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _pem(cert) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return cert.public_bytes(Encoding.PEM)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

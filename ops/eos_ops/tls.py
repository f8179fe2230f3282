"""Certificates for the local secured broker, made at run time: a CA, a broker certificate it signs,
and the CA certificate as the clients' truststore.

Made with the `cryptography` package, in PEM: Kafka reads a PEM key store and trust store
(`ssl.keystore.type=PEM`, KIP-651; an unencrypted PKCS#8 key since KAFKA-12703) and librdkafka
reads the CA file (`ssl.ca.location`), so no keytool, no JKS and no store password are needed.
The CA's private key is never written anywhere: it signs the broker certificate and is dropped,
so no one can later mint another certificate this CA vouches for. Every file is 0600 in a 0700
folder: the broker key is a secret, and the rest is private to the user who runs the broker.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The local broker listens on loopback; librdkafka and Kafka's Java clients both check the broker's
# name (ssl.endpoint.identification.algorithm=https by default) against these.
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
VALID_DAYS = 3650
_KEY_USAGES = (
    "digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
    "key_cert_sign", "crl_sign", "encipher_only", "decipher_only",
)  # fmt: skip


@dataclass(frozen=True)
class BrokerTls:
    """The PEM files of one local broker (or of every node of a local cluster: they share a host)."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        """The CA certificate: the clients' truststore (librdkafka `ssl.ca.location`)."""
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        """The broker's private key (PKCS#8) followed by its certificate and the CA's (ssl.keystore.location)."""
        return self.folder / "broker-keystore.pem"

    def exists(self) -> bool:
        return self.ca_file.exists() and self.keystore.exists()


def private_folder(folder: Path) -> Path:
    """Create `folder` (and its parents) and make it 0700, owned by us; refuse one another user owns."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        from eos.errors import EnvironmentProblem

        raise EnvironmentProblem(f"{folder} belongs to another user: it cannot hold this user's keys.")
    folder.chmod(0o700)
    return folder


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file that only its owner can read, from its first byte (never briefly world-readable)."""
    raw = data.encode() if isinstance(data, str) else data
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(raw)


class CertificateAuthority:
    """A CA made in memory (EC P-256), which signs certificates for names (IP addresses and DNS
    names). Its key never touches a disk: once it is dropped, no one can mint another certificate it
    vouches for. The local secured broker, and the tests' TLS servers (PostgreSQL, the schema
    registry's proxy), all get their certificates from one."""

    def __init__(self, common_name: str, valid_days: int = VALID_DAYS):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.valid_days = valid_days
        self._key = ec.generate_private_key(ec.SECP256R1())  # P-256: a key in microseconds (RSA ~0.1 s)
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usage = {name: False for name in _KEY_USAGES} | {"key_cert_sign": True, "crl_sign": True}
        self.cert = (
            self._builder(self.name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(**usage), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    def _builder(self, subject: Any, public_key: Any) -> Any:
        from cryptography import x509

        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=self.valid_days))
        )

    @property
    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, names: tuple[str, ...], common_name: str, client: bool = False) -> tuple[bytes, bytes]:
        """(the new key as unencrypted PKCS#8 PEM, its certificate as PEM) for a server at `names`; a
        `client` certificate serves both ends (a broker is the client of its peers)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        alternatives: list[x509.GeneralName] = []
        for name in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternatives.append(x509.DNSName(name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]
        cert = (
            self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key.public_key())
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return key_pem, cert.public_bytes(pem)


def make_broker_tls(folder: Path, names: tuple[str, ...] = LOOPBACK_NAMES) -> BrokerTls:
    """The CA and the broker certificate in `folder`, made once (an existing pair is kept: clients
    already trust its CA)."""
    tls = BrokerTls(private_folder(folder))
    if tls.exists():
        return tls
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = CertificateAuthority(f"eos local Kafka CA {now:%Y-%m-%d %H:%M:%S}")
    key_pem, cert_pem = ca.issue(names, "eos local Kafka broker", client=True)
    write_private(tls.keystore, key_pem + cert_pem + ca.cert_pem)
    write_private(tls.ca_file, ca.cert_pem)
    return tls

"""The secured Kafka under test: ONE local broker with SASL_SSL (SCRAM-SHA-512 over TLS) and the
StandardAuthorizer (no ACL, no access), started once per session and shared by every test that
needs security (the `secure_kafka` fixture in tests/conftest.py).

Tests share it the way they share the plain broker: each makes its own users, topics and ACLs
under unique names, and removes the ACLs it granted if later tests must not inherit them.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos_ops import kafka_security


@dataclass
class SecureKafka:
    """A running secured broker.

    bootstrap: its SASL_SSL listener; ca_file: the CA certificate clients trust (ssl.ca.location);
    admin: an AdminClient of the super user (the broker's own principal) for set-up only: topics,
    users, ACLs; settings(user): the librdkafka settings of a SCRAM user, created on first use with
    a random password; start_seconds: how long the broker took to start."""

    bootstrap: str
    ca_file: Path
    broker: Any  # eos_ops.localkafka.LocalBroker
    start_seconds: float
    admin: Any = field(repr=False)
    _passwords: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def admin_settings(self) -> dict[str, str]:
        """The super user's librdkafka settings (for set-up clients; never a pipeline's)."""
        return self.broker.client_settings()

    def settings(self, user: str) -> dict[str, str]:
        """librdkafka settings of `user`: security.protocol SASL_SSL, sasl.mechanism SCRAM-SHA-512,
        ssl.ca.location, sasl.username and sasl.password. The user is created on first use; it can
        do nothing until an ACL lets it (grant() or kafka_security.create_acls)."""
        if user == kafka_security.BROKER_USER:
            raise ValueError("the broker's own principal is the super user: use admin_settings for set-up")
        if user not in self._passwords:
            password = secrets.token_urlsafe(18)
            kafka_security.add_scram_user(self.admin, user, password)
            self._passwords[user] = password
        return kafka_security.user_settings(self.bootstrap, self.ca_file, user, self._passwords[user])

    def grant_all(self, user: str) -> list[kafka_security.Acl]:
        """Every operation on every topic, group, transactional id and the cluster, for `user` (created
        if new): for tests whose subject is not least privilege. Returns the ACLs (for revoke)."""
        self.settings(user)
        return kafka_security.grant_all(self.admin, f"User:{user}")

    def revoke(self, acls: list[kafka_security.Acl]) -> None:
        kafka_security.delete_acls(self.admin, acls)

    def close(self) -> None:
        self.broker.stop()


def start_secure_kafka(workdir: Path, heap: str = "512m") -> SecureKafka:
    """A secured LocalBroker in `workdir` on free ports, always the embedded one (never
    EOS_KAFKA_BOOTSTRAP or a container): the tests need its super user to set up users and ACLs."""
    from eos_connectors.kafka.clients import admin_client
    from eos_ops.localkafka import LocalBroker, free_port

    broker = LocalBroker(port=free_port(), data_dir=workdir / "secure-broker", heap=heap, secure=True)
    started = time.monotonic()
    broker.start(progress=print)
    seconds = time.monotonic() - started
    return SecureKafka(
        bootstrap=broker.bootstrap,
        ca_file=broker.security.tls.ca_file,
        broker=broker,
        start_seconds=seconds,
        admin=admin_client(broker.client_settings()),
    )

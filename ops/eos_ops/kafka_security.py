"""The local broker secured: SASL_SSL (SCRAM-SHA-512 over TLS) for clients, the StandardAuthorizer,
and the small admin helpers that create SCRAM users and ACLs on it.

One principal, `User:broker`, is the brokers' own and the only super user. It authenticates
- on the client listener (SASL_SSL, also the inter-broker listener) with SCRAM-SHA-512: its
  credential is written into the metadata when the storage is formatted (`--add-scram`, KIP-900),
  since a broker needs it before any admin request could create it;
- on the controller listener (SASL_SSL too) with PLAIN: a controller cannot check SCRAM before it
  has loaded the metadata that holds the credentials, so its users are listed in its JAAS section.
Every other principal is created after start (`add_scram_user`) and can do nothing until an ACL
grants it something (`allow.everyone.if.no.acl.found=false`).

No password is ever on a command line: the broker reads them from its JAAS file (0600, passed as
`-Djava.security.auth.login.config=PATH`), the storage tool from a 0600 argument file (`java @file`,
deleted once the format is done), clients from `client.properties` (0600).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eos.errors import EnvironmentProblem
from eos_ops.tls import BrokerTls, make_broker_tls, private_folder, write_private

BROKER_USER = "broker"
BROKER_PRINCIPAL = f"User:{BROKER_USER}"
MECHANISM = "SCRAM-SHA-512"
CLIENT_LISTENER = "SASL_SSL"
CONTROLLER_LISTENER = "CONTROLLER"
SCRAM_ITERATIONS = 8192  # SCRAM-SHA-512's minimum in Kafka is 4096; 8192 is its tools' default
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def listener_settings(host: str, port: int, controller_port: int, secure: bool) -> dict[str, str]:
    """The placeholders of ops/kafka's templates that say which listeners a node has and how each is secured."""
    if not secure:
        listeners = f"PLAINTEXT://{host}:{port},{CONTROLLER_LISTENER}://{host}:{controller_port}"
        return {
            "listeners": listeners,
            "inter_broker_listener": "PLAINTEXT",
            "protocol_map": f"{CONTROLLER_LISTENER}:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
    listeners = f"{CLIENT_LISTENER}://{host}:{port},{CONTROLLER_LISTENER}://{host}:{controller_port}"
    return {
        "listeners": listeners,
        "inter_broker_listener": CLIENT_LISTENER,
        "protocol_map": f"{CONTROLLER_LISTENER}:SASL_SSL,{CLIENT_LISTENER}:SASL_SSL",
    }


class BrokerSecurity:
    """The secrets and settings of one secured local broker or cluster, kept in a private folder:
    the TLS files (eos_ops.tls), the broker's password, its JAAS file and the super user's client
    settings. Made once; a restart reuses them (the SCRAM credential is in the formatted storage)."""

    def __init__(self, folder: Path):
        self.folder = folder

    @property
    def tls(self) -> BrokerTls:
        return BrokerTls(self.folder)

    @property
    def password_file(self) -> Path:
        return self.folder / "broker.password"

    @property
    def jaas_file(self) -> Path:
        return self.folder / "broker.jaas"

    @property
    def client_file(self) -> Path:
        """librdkafka settings of the super user (`key=value` lines: kcat -F reads them too)."""
        return self.folder / "client.properties"

    def exists(self) -> bool:
        return self.password_file.exists()

    def make(self) -> None:
        """The CA, the broker's certificate and password, and its JAAS file (idempotent)."""
        private_folder(self.folder)
        make_broker_tls(self.folder)
        if not self.password_file.exists():
            # URL-safe characters only: no quoting needed in JAAS, properties or the storage tool's argument.
            write_private(self.password_file, secrets.token_urlsafe(24))
        write_private(self.jaas_file, self._jaas())

    @property
    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError as exc:
            raise EnvironmentProblem(f"the broker's password file {self.password_file} is unreadable: {exc}") from None

    def _jaas(self) -> str:
        """Per listener (Kafka reads `<listener name in lower case>.KafkaServer`): username and password
        are what this broker sends when it is the client (of a peer broker, of a controller); the
        PLAIN section's `user_<name>` entries are who the controller accepts."""
        user, password = BROKER_USER, self.password
        return (
            f"{CLIENT_LISTENER.lower()}.KafkaServer {{\n"
            "  org.apache.kafka.common.security.scram.ScramLoginModule required\n"
            f'  username="{user}"\n  password="{password}";\n}};\n'
            f"{CONTROLLER_LISTENER.lower()}.KafkaServer {{\n"
            "  org.apache.kafka.common.security.plain.PlainLoginModule required\n"
            f'  username="{user}"\n  password="{password}"\n  user_{user}="{password}";\n}};\n'
        )

    def server_properties(self) -> str:
        """The broker settings that secure it (appended to the rendered template)."""
        tls = self.tls
        return "\n".join([
            "",
            "# Secured (eos kafka start --secure): SASL_SSL everywhere, SCRAM-SHA-512 for clients and between",
            "# brokers, PLAIN on the controller listener (a controller checks it before any metadata is loaded),",
            "# the StandardAuthorizer with no access unless an ACL grants it, and the brokers' own principal as",
            "# the only super user. Passwords: in the JAAS file, never in this file.",
            f"listener.name.{CLIENT_LISTENER.lower()}.sasl.enabled.mechanisms={MECHANISM}",
            f"listener.name.{CONTROLLER_LISTENER.lower()}.sasl.enabled.mechanisms=PLAIN",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            "sasl.mechanism.controller.protocol=PLAIN",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={tls.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls.ca_file}",
            "ssl.client.auth=none",
            f"authorizer.class.name={AUTHORIZER}",
            "allow.everyone.if.no.acl.found=false",
            f"super.users={BROKER_PRINCIPAL}",
            "",
        ])  # fmt: skip

    def scram_argument(self) -> str:
        """StorageTool's `--add-scram` value for the broker's own credential (for an argument file only)."""
        return f"{MECHANISM}=[name={BROKER_USER},password={self.password}]"

    def jvm_option(self) -> str:
        return f"-Djava.security.auth.login.config={self.jaas_file}"

    def client_settings(self, bootstrap: str) -> dict[str, str]:
        """librdkafka settings of the super user (the brokers' own principal): for setting up topics,
        users and ACLs, never for a pipeline."""
        return user_settings(bootstrap, self.tls.ca_file, BROKER_USER, self.password)

    def write_client_file(self, bootstrap: str) -> Path:
        settings = self.client_settings(bootstrap)
        lines = [
            f"# librdkafka settings of {BROKER_PRINCIPAL}, the local broker's super user (kcat -F reads this file).",
            "# For setting up topics, users and ACLs; give each pipeline a user of its own.",
            *(f"{key}={value}" for key, value in settings.items()),
        ]
        write_private(self.client_file, "\n".join(lines) + "\n")
        return self.client_file


def user_settings(bootstrap: str, ca_file: Path | str, user: str, password: str) -> dict[str, str]:
    """The librdkafka settings of a SCRAM user of the secured local broker."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "ssl.ca.location": str(ca_file),
        "sasl.username": user,
        "sasl.password": password,
    }


def write_argument_file(path: Path, arguments: Iterable[str]) -> Path:
    """A `java @file` argument file, 0600: what would otherwise show a secret in `ps`."""
    for argument in arguments:
        if any(c.isspace() or c in "\"'#\\" for c in argument):
            raise ValueError(f"argument {argument!r} would need quoting in a java argument file")
    write_private(path, "\n".join(arguments) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Users and ACLs on a running cluster, through the AdminClient (as the super user)
# ---------------------------------------------------------------------------------------------


def add_scram_user(admin: Any, user: str, password: str, timeout: float = 30.0) -> None:
    """Create (or change) `user`'s SCRAM-SHA-512 credential, and wait until the broker answering
    `admin` knows it: a client that authenticates right after must not race the metadata."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, password.encode())], request_timeout=timeout
    )
    for future in futures.values():
        future.result()
    _wait_for(lambda: _knows_user(admin, user), timeout, f"SCRAM user {user!r} in the broker's metadata")


def delete_scram_user(admin: Any, user: str, timeout: float = 30.0) -> None:
    from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)], request_timeout=timeout
    )
    for future in futures.values():
        future.result()


def _knows_user(admin: Any, user: str) -> bool:
    try:
        return bool(admin.describe_user_scram_credentials([user], request_timeout=5)[user].result())
    except Exception:  # RESOURCE_NOT_FOUND until the broker has applied the record
        return False


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL: `principal` may `operation` on a resource. Names are Kafka's, as strings:
    resource TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID; pattern LITERAL or PREFIXED; operation READ,
    WRITE, DESCRIBE, CREATE, ALTER, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE, ALL, ..."""

    principal: str
    resource: str
    name: str
    operation: str
    pattern: str = "LITERAL"
    host: str = "*"

    def binding(self, as_filter: bool = False) -> Any:
        """The AclBinding to create, or with as_filter=True the AclBindingFilter that matches exactly it."""
        from confluent_kafka import admin as kafka_admin

        kind = kafka_admin.AclBindingFilter if as_filter else kafka_admin.AclBinding
        # librdkafka calls Kafka's CLUSTER resource type (4) BROKER.
        resource = "BROKER" if self.resource == "CLUSTER" else self.resource
        return kind(
            kafka_admin.ResourceType[resource],
            self.name,
            kafka_admin.ResourcePatternType[self.pattern],
            self.principal,
            self.host,
            kafka_admin.AclOperation[self.operation],
            kafka_admin.AclPermissionType.ALLOW,
        )


def create_acls(admin: Any, acls: Iterable[Acl], timeout: float = 30.0) -> None:
    """Grant `acls` and wait until the broker answering `admin` enforces them."""
    wanted = list(acls)
    if not wanted:
        return
    futures = admin.create_acls([acl.binding() for acl in wanted], request_timeout=timeout)
    for future in futures.values():
        future.result()
    _wait_for(lambda: all(_present(admin, acl) for acl in wanted), timeout, f"{len(wanted)} ACLs in force")


def delete_acls(admin: Any, acls: Iterable[Acl], timeout: float = 30.0) -> None:
    """Revoke `acls` (each exactly as it was granted) and wait until the broker no longer enforces them."""
    wanted = list(acls)
    if not wanted:
        return
    futures = admin.delete_acls([acl.binding(as_filter=True) for acl in wanted], request_timeout=timeout)
    for future in futures.values():
        future.result()
    _wait_for(lambda: not any(_present(admin, acl) for acl in wanted), timeout, f"{len(wanted)} ACLs removed")


def grant_all(admin: Any, principal: str, timeout: float = 30.0) -> list[Acl]:
    """Every operation on every topic, group and transactional id, and on the cluster: what a test
    grants when least privilege is not its subject. Returns the ACLs, for delete_acls."""
    acls = [
        Acl(principal, resource, name, "ALL", pattern)
        for resource, name, pattern in (
            ("TOPIC", "*", "LITERAL"),
            ("GROUP", "*", "LITERAL"),
            ("TRANSACTIONAL_ID", "*", "LITERAL"),
            ("CLUSTER", "kafka-cluster", "LITERAL"),
        )
    ]
    create_acls(admin, acls, timeout)
    return acls


def _present(admin: Any, acl: Acl) -> bool:
    return bool(admin.describe_acls(acl.binding(as_filter=True), request_timeout=5).result())


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise EnvironmentProblem(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)

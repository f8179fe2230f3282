"""A pipeline entry's librdkafka client settings as Java client properties, for Kafka's own tools
(`eos status` runs TransactionsCommand: confluent-kafka has no DescribeTransactions).

The two clients name their settings differently: librdkafka's `ssl.ca.location` is a Java PEM
trust store, its client certificate and key files are a Java PEM key store given inline, SASL
user and password are a JAAS line. What has no Java equivalent this module knows (OAUTHBEARER's
and Kerberos' settings, certificate verification turned off, ...) is named in an error instead of
being dropped: a tool that ran without a security setting would reach the cluster as someone else,
or not at all, and report less than there is.

The properties hold secrets: they go into a 0600 file (`--command-config`), never onto a command line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Same name, same meaning in both clients.
SAME = ("security.protocol", "client.id", "ssl.key.password", "ssl.keystore.password", "sasl.kerberos.service.name")


class NoJavaEquivalent(ValueError):
    pass


def java_properties(client: Mapping[str, Any]) -> dict[str, str]:
    """Java client properties for `client` (librdkafka settings); raises NoJavaEquivalent naming every
    setting that has none here."""
    settings = {key: str(value) for key, value in client.items() if key != "bootstrap.servers"}
    java: dict[str, str] = {}
    unmapped: list[str] = []
    mechanism = settings.pop("sasl.mechanism", None) or settings.pop("sasl.mechanisms", None)
    if mechanism:
        java["sasl.mechanism"] = mechanism
    user, password = settings.pop("sasl.username", None), settings.pop("sasl.password", None)
    if user is not None:
        module = {"PLAIN": "plain.PlainLoginModule", "SCRAM-SHA-256": "scram.ScramLoginModule",
                  "SCRAM-SHA-512": "scram.ScramLoginModule"}.get((mechanism or "PLAIN").upper())  # fmt: skip
        if module is None:
            unmapped.append(f"sasl.username with sasl.mechanism={mechanism}")
        else:
            java["sasl.jaas.config"] = (
                f'org.apache.kafka.common.security.{module} required username="{_jaas(user)}" '
                f'password="{_jaas(password or "")}";'
            )
    for key in SAME:
        if key in settings:
            java[key] = settings.pop(key)
    if "ssl.ca.location" in settings:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = settings.pop("ssl.ca.location")
    if "ssl.ca.pem" in settings:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.certificates"] = settings.pop("ssl.ca.pem")
    if "ssl.endpoint.identification.algorithm" in settings:
        value = settings.pop("ssl.endpoint.identification.algorithm")
        java["ssl.endpoint.identification.algorithm"] = "" if value.lower() == "none" else value
    if "ssl.certificate.location" in settings and "ssl.key.location" in settings:
        java["ssl.keystore.type"] = "PEM"
        java["ssl.keystore.certificate.chain"] = _read(settings.pop("ssl.certificate.location"))
        java["ssl.keystore.key"] = _read(settings.pop("ssl.key.location"))
    if "ssl.certificate.pem" in settings and "ssl.key.pem" in settings:
        java["ssl.keystore.type"] = "PEM"
        java["ssl.keystore.certificate.chain"] = settings.pop("ssl.certificate.pem")
        java["ssl.keystore.key"] = settings.pop("ssl.key.pem")
    if "ssl.keystore.location" in settings:  # librdkafka's is a PKCS#12 file
        java["ssl.keystore.type"] = "PKCS12"
        java["ssl.keystore.location"] = settings.pop("ssl.keystore.location")
    if str(settings.get("enable.ssl.certificate.verification", "true")).lower() in ("true", "1"):
        settings.pop("enable.ssl.certificate.verification", None)
    unmapped += [
        key for key in settings
        if key.startswith(("ssl.", "sasl.", "enable.ssl.", "security.")) or key == "enable.ssl.certificate.verification"
    ]  # fmt: skip
    if unmapped:
        raise NoJavaEquivalent(
            "no Java client equivalent for " + ", ".join(sorted(unmapped)) + " (Kafka's tools run as Java clients)"
        )
    return java


def _jaas(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _read(path: str) -> str:
    return Path(path).expanduser().read_text()


def write_command_config(client: Mapping[str, Any]) -> str | None:
    """A 0600 temporary properties file of java_properties(client) (the caller deletes it), or None
    for a client with no security settings."""
    properties = java_properties(client)
    if not properties:
        return None
    handle, path = tempfile.mkstemp(prefix="eos-kafka-tool-", suffix=".properties")  # mode 0600
    with os.fdopen(handle, "w") as out:
        out.writelines(f"{key}={_escape(value)}\n" for key, value in properties.items())
    return path


def _escape(value: str) -> str:
    """A java.util.Properties value: backslashes and line breaks escaped (PEM blocks span lines)."""
    return value.replace("\\", "\\\\").replace("\r", "").replace("\n", "\\n")

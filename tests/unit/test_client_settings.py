"""Which client settings each Kafka client eos builds takes from a pipeline entry (pure logic: the
secured-broker tests in tests/secure run the same clients against a real SASL_SSL broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eos.config import parse_pipeline
from eos.declared import connectors, pipeline_info
from eos_connectors.kafka.clients import CONSUMER_ONLY, PRODUCER_ONLY, principal, settings_for
from eos_ops.java_client import NoJavaEquivalent, java_properties

SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "eos",
    "sasl.oauthbearer.client.secret": "s3cret",
    "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
    "enable.sasl.oauthbearer.unsecure.jwt": False,
    "enable.ssl.certificate.verification": True,
    "ssl.endpoint.identification.algorithm": "https",
    "ssl.ca.location": "/etc/eos/ca.pem",
    "client.id": "eos-clicks",
    "socket.connection.setup.timeout.ms": 20000,
}
SOURCE_TUNING = {"fetch.max.bytes": 1048576, "group.instance.id": "x", "isolation.level": "read_uncommitted"}
SINK_TUNING = {"linger.ms": 50, "acks": "all", "transactional.id": "not-eos-s"}


def test_each_client_type_takes_every_setting_but_the_other_types_own() -> None:
    entry = {**SECURITY, **SOURCE_TUNING, **SINK_TUNING}
    assert settings_for("producer", entry) == {**SECURITY, **SINK_TUNING}
    assert settings_for("consumer", entry) == {**SECURITY, **SOURCE_TUNING}
    assert settings_for("admin", entry) == SECURITY
    assert not CONSUMER_ONLY & PRODUCER_ONLY


def _pipeline(tmp_path: Path, on_error: str = "dlq"):
    source_config = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {str(v).lower()}" for k, v in
                              {**SECURITY, **SOURCE_TUNING}.items())  # fmt: skip
    text = f"""
name: secured
checkpoint: {tmp_path / "cp"}
sources:
  - name: events
    kafka: {{bootstrap: "127.0.0.1:9093", topics: [in], config: {{{source_config}}}}}
    value_format: string
    on_error: {on_error}
    dlq_topic: in-dlq
sinks:
  - name: out
    kafka: {{bootstrap: "127.0.0.1:9093", topic: out}}
    value: value
    value_format: string
"""
    config = parse_pipeline(text)
    return connectors(config, pipeline_info(config, "cp", tmp_path))


def test_the_control_log_and_the_dead_letter_queue_keep_the_sources_whole_settings(tmp_path: Path) -> None:
    # Before: both kept only "connection settings" (bootstrap, security., sasl., ssl., socket.), which
    # dropped client.id, enable.ssl.certificate.verification and enable.sasl.oauthbearer.unsecure.jwt.
    found = _pipeline(tmp_path)
    source_client = found.sources[0].client
    control = found.sources[0].control_log()
    assert control.client == source_client
    dead_letters = found.sinks[-1]
    assert dead_letters.name == "events.dlq"
    assert dead_letters.client == source_client
    # What each builds from them: the producers take every security setting, no consumer setting.
    writer = dead_letters.writer().config("txid", None)
    for key, value in SECURITY.items():
        assert writer[key] == value, key
    assert not set(SOURCE_TUNING) & set(settings_for("producer", writer))


def test_principal_names_who_a_client_is_without_its_secret() -> None:
    scram = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
             "sasl.password": "pw"}  # fmt: skip
    assert principal(scram) == "User:alice (SCRAM-SHA-512)"
    assert principal(SECURITY) == "the OAUTHBEARER principal of client eos-clicks"
    assert principal({"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"}) == (
        "the TLS client certificate /c.pem"
    )
    assert principal({}) == "ANONYMOUS (PLAINTEXT, no SASL user)"


def test_kafka_tools_get_the_java_form_of_the_security_settings(tmp_path: Path) -> None:
    (tmp_path / "client.pem").write_text("-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n")
    (tmp_path / "client.key").write_text("-----BEGIN PRIVATE KEY-----\nBBB\n-----END PRIVATE KEY-----\n")
    client = {
        "bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": 'p"w', "ssl.ca.location": "/ca.pem", "client.id": "eos",
        "ssl.endpoint.identification.algorithm": "none", "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"), "linger.ms": 5,
    }  # fmt: skip
    assert java_properties(client) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
        'password="p\\"w";',
        "client.id": "eos",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": (tmp_path / "client.pem").read_text(),
        "ssl.keystore.key": (tmp_path / "client.key").read_text(),
    }
    unmapped = r"enable\.ssl\.certificate\.verification, sasl\.oauthbearer\.client\.id"
    with pytest.raises(NoJavaEquivalent, match=unmapped):
        java_properties({**SECURITY, "enable.ssl.certificate.verification": False})

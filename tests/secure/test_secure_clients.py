"""Every Kafka client eos builds from a pipeline entry carries that entry's security settings, on the
secured broker (no Spark: the connectors are driven directly, as recovery and `eos status` do)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from eos.config import load_pipeline
from eos.declared import Connectors, connectors, pipeline_info
from eos.errors import EnvironmentProblem
from eos.protocol.decision import DriverInfo
from eos_connectors.kafka import ids
from eos_connectors.kafka.clients import create_topic, producer
from eos_connectors.kafka.sink import KafkaSink
from eos_ops.kafka_security import Acl, create_acls, delete_acls
from tests.pipelines import passthrough_pipeline, write_pipeline
from tests.support_secure import SecureKafka


def _connectors(folder: Path, config: dict) -> Connectors:
    path = write_pipeline(folder, config)
    loaded = load_pipeline(path)
    return connectors(loaded, pipeline_info(loaded, "test-checkpoint", path.parent))


def _without_ca(settings: dict) -> dict:
    """A user's settings that trust the broker without its CA file: certificate verification off
    (what a self-signed test cluster is often reached with). A client that drops the setting fails
    its TLS handshake."""
    kept = {k: v for k, v in settings.items() if k != "ssl.ca.location"}
    return kept | {"enable.ssl.certificate.verification": False}


def test_the_control_log_and_the_dead_letter_queue_carry_the_sources_settings(
    secure_kafka: SecureKafka, unique_name, tmp_path: Path
) -> None:
    user = unique_name("u")
    settings = secure_kafka.settings(user)
    acls = secure_kafka.grant_all(user)
    try:
        source, sink = unique_name("in"), unique_name("out")
        for topic in (source, sink):
            assert create_topic(secure_kafka.admin, topic, 1)
        config = passthrough_pipeline(unique_name("p"), secure_kafka.bootstrap, source, sink, tmp_path / "cp")
        client = {k: v for k, v in _without_ca(settings).items() if k != "bootstrap.servers"}
        client["client.id"] = "eos-secured-test"
        config["sources"][0]["kafka"]["config"] = client
        config["sources"][0] |= {"on_error": "dlq", "dlq_topic": unique_name("dlq")}
        config["sinks"][0]["kafka"]["config"] = client
        found = _connectors(tmp_path, config)

        control = found.sources[0].control_log()
        try:
            me = DriverInfo(uuid.uuid4().hex, socket.gethostname(), os.getpid(), "127.0.0.1:0")
            assert control.take_over(me).previous is None  # TLS without the CA file, SCRAM: it connects
        finally:
            control.close()
        assert control.client["client.id"] == "eos-secured-test"

        dead_letters = found.sinks[-1]
        assert dead_letters.name.endswith(".dlq")
        dead_letters.check(None)  # creates the DLQ topic through the source's settings
        assert KafkaSink.fence([dead_letters], {dead_letters.name: dead_letters.pool(1)}, 30) == 1
    finally:
        secure_kafka.revoke(acls)


def _two_principals(secure_kafka: SecureKafka, unique_name) -> tuple[dict[str, dict], dict[str, str], list[Acl]]:
    """Two users, each allowed every topic but only the transactional ids under its own prefix."""
    settings, prefixes, acls = {}, {}, []
    for role in ("a", "b"):
        user = unique_name(f"u{role}")
        settings[role] = secure_kafka.settings(user)
        prefixes[role] = unique_name(f"tx{role}")
        acls += [
            Acl(f"User:{user}", "TOPIC", "*", "ALL"),
            Acl(f"User:{user}", "TRANSACTIONAL_ID", prefixes[role], "ALL", pattern="PREFIXED"),
        ]
    create_acls(secure_kafka.admin, acls)
    return settings, prefixes, acls


def _two_sink_connectors(secure_kafka, unique_name, tmp_path, settings, prefixes) -> Connectors:
    source, out_a, out_b = unique_name("in"), unique_name("outa"), unique_name("outb")
    for topic in (source, out_a, out_b):
        assert create_topic(secure_kafka.admin, topic, 1)
    config = passthrough_pipeline(unique_name("p"), secure_kafka.bootstrap, source, out_a, tmp_path / "cp")
    config["sources"][0]["kafka"]["config"] = _entry_config(settings["a"])
    first = config["sinks"][0]
    first["kafka"]["config"] = _entry_config(settings["a"])
    first["transactional_id_prefix"] = prefixes["a"]
    second = {**first, "name": "out_b", "kafka": {"bootstrap": secure_kafka.bootstrap, "topic": out_b}}
    second["kafka"]["config"] = _entry_config(settings["b"])
    second["transactional_id_prefix"] = prefixes["b"]
    config["sinks"].append(second)
    return _connectors(tmp_path, config)


def _entry_config(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != "bootstrap.servers"}


def test_recovery_fences_each_pool_with_the_credentials_of_its_own_sink(
    secure_kafka: SecureKafka, unique_name, tmp_path: Path
) -> None:
    settings, prefixes, acls = _two_principals(secure_kafka, unique_name)
    try:
        found = _two_sink_connectors(secure_kafka, unique_name, tmp_path, settings, prefixes)
        first, second = found.sinks
        assert first.system() == second.system()  # one cluster: one fencing group
        # A zombie of the second sink: an open transaction on its id, as a crashed slot leaves it.
        zombie = producer({**settings["b"], "transactional.id": ids.pool_id(prefixes["b"], second.name, 1)})
        zombie.init_transactions(30)
        zombie.begin_transaction()
        zombie.produce(second.entry.kafka.topic, b"zombie")
        zombie.flush(30)

        pools = {first.name: first.pool(2), second.name: second.pool(2)}
        assert KafkaSink.fence(found.sinks, pools, 30) == 4
        with pytest.raises(KafkaException, match=r"(?i)fenced|epoch"):
            zombie.commit_transaction(30)
    finally:
        delete_acls(secure_kafka.admin, acls)


def test_a_pool_of_a_removed_sink_is_fenced_by_a_sink_allowed_to_or_named_in_a_clear_error(
    secure_kafka: SecureKafka, unique_name, tmp_path: Path
) -> None:
    settings, prefixes, acls = _two_principals(secure_kafka, unique_name)
    try:
        found = _two_sink_connectors(secure_kafka, unique_name, tmp_path, settings, prefixes)
        first = found.sinks[0]
        system = first.system()
        # A removed sink whose ids only the second sink's principal may use: fenced with its credentials.
        gone = type(first.pool(1))(2, "kafka", system, {"prefix": prefixes["b"]})
        assert KafkaSink.fence(found.sinks, {"removed": gone}, 30) == 2

        # One that neither principal may use: a clear error naming the credentials tried.
        nobody = type(first.pool(1))(1, "kafka", system, {"prefix": unique_name("txc")})
        with pytest.raises(EnvironmentProblem) as refused:
            KafkaSink.fence(found.sinks, {"removed": nobody}, 30)
        message = str(refused.value)
        assert "removed" in message and nobody.detail["prefix"] in message
        for role in ("a", "b"):
            assert f"User:{settings[role]['sasl.username']}" in message
            assert settings[role]["sasl.password"] not in message
    finally:
        delete_acls(secure_kafka.admin, acls)

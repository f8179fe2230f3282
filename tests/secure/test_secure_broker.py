"""The secured local broker itself (eos_ops.localkafka with secure=True, eos_ops.kafka_security):
SASL_SSL only, no access without an ACL, secrets kept out of command lines and other users' reach."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from eos_connectors.kafka.clients import admin_client, consumer, create_topic, producer
from eos_ops import kafka_security
from tests.support_secure import SecureKafka


def _produce_in_transaction(settings: dict, topic: str, txid: str, values: list[bytes]) -> None:
    out = producer({**settings, "transactional.id": txid})
    out.init_transactions(30)
    out.begin_transaction()
    for value in values:
        out.produce(topic, value)
    out.commit_transaction(30)


def _committed_values(settings: dict, topic: str, expected: int) -> list[bytes]:
    reader = consumer({**settings, "isolation.level": "read_committed", "enable.partition.eof": True})
    from confluent_kafka import TopicPartition

    reader.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        while True:
            message = reader.poll(10)
            assert message is not None, f"{topic}: no end of partition after {values}"
            if message.error():
                break
            values.append(message.value())
    finally:
        reader.close()
    assert len(values) == expected, values
    return values


def test_a_user_needs_acls_and_a_granted_user_commits_transactions(secure_kafka: SecureKafka, unique_name) -> None:
    topic = unique_name("sec")
    assert create_topic(secure_kafka.admin, topic, 1)
    user = unique_name("u")
    settings = secure_kafka.settings(user)

    # Authenticated but granted nothing: the topic is invisible and a transactional id is refused.
    assert topic not in admin_client(settings).list_topics(timeout=15).topics
    with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        producer({**settings, "transactional.id": unique_name("tx")}).init_transactions(30)

    acls = secure_kafka.grant_all(user)
    try:
        _produce_in_transaction(settings, topic, unique_name("tx"), [b"one", b"two"])
        assert _committed_values(settings, topic, 2) == [b"one", b"two"]
    finally:
        secure_kafka.revoke(acls)
    assert topic not in admin_client(settings).list_topics(timeout=15).topics  # the ACLs are gone again


def test_a_wrong_password_and_plaintext_are_refused(secure_kafka: SecureKafka, unique_name) -> None:
    settings = secure_kafka.settings(unique_name("u"))
    wrong_password = {**settings, "sasl.password": "not-the-password"}
    plaintext = {"bootstrap.servers": secure_kafka.bootstrap}
    for wrong, expected in ((wrong_password, "invalid credentials"), (plaintext, "")):
        errors: list = []
        admin = admin_client({**wrong, "log_level": 0, "socket.timeout.ms": 2000, "error_cb": errors.append})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
        # librdkafka reports the failure through error_cb from its background threads, when it
        # gets to it: under load that is after list_topics gave up.
        deadline = time.monotonic() + 20
        while not any(expected in str(error) for error in errors) and time.monotonic() < deadline:
            admin.poll(0.5)
        assert any(expected in str(error) for error in errors), errors


def test_no_secret_on_the_command_line_and_the_files_are_private(secure_kafka: SecureKafka) -> None:
    broker = secure_kafka.broker
    security = broker.security
    password = security.password
    cmdline = Path(f"/proc/{broker.pid()}/cmdline").read_bytes()
    assert password.encode() not in cmdline
    assert str(security.jaas_file).encode() in cmdline  # the password's file is named, not the password
    assert password not in broker.properties_file.read_text()
    assert not broker.format_arguments_file.exists()  # the storage tool's argument file is gone
    assert stat.S_IMODE(security.folder.stat().st_mode) == 0o700
    for path in security.folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # The CA's key never reaches the disk: only the broker's own key is in the folder.
    keys = [p.name for p in security.folder.iterdir() if b"PRIVATE KEY" in p.read_bytes()]
    assert keys == [security.tls.keystore.name]


def test_eos_kafka_status_and_start_name_the_client_settings_without_the_password(
    secure_kafka: SecureKafka,
) -> None:
    broker = secure_kafka.broker
    where = ["--port", str(broker.port), "--data-dir", str(broker.data_dir)]
    env = {**os.environ, "EOS_HOME": str(broker.data_dir.parent)}
    for command in (["status", *where], ["start", *where, "--secure"]):
        done = subprocess.run(
            [sys.executable, "-m", "eos.cli", "kafka", *command], capture_output=True, text=True, env=env, timeout=120
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert str(broker.security.client_file) in output
        assert broker.security.password not in output
    settings = dict(
        line.split("=", 1) for line in broker.security.client_file.read_text().splitlines() if not line.startswith("#")
    )
    assert settings == broker.client_settings()  # the file works as it is (kcat -F, or a client's settings)
    assert f"User:{settings['sasl.username']}" == kafka_security.BROKER_PRINCIPAL

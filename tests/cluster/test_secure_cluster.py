"""The local three-node cluster secured (`eos kafka start --brokers 3 --secure`): SASL_SSL between
clients and brokers, between brokers and to the controllers, the StandardAuthorizer on every node.

A cluster of its own, started and stopped by this one test: the shared cluster of tests/cluster
serves PLAINTEXT clients, and ACLs on it would change what every other cluster test exercises.
The start is timed and printed (the cost this test adds to the suite)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from eos_connectors.kafka.clients import admin_client, create_topic, producer
from eos_ops import kafka_security
from eos_ops.kafka_security import Acl
from eos_ops.localkafka import LocalCluster, free_port
from tests.pipelines import eos_subprocess
from tests.support import independent_committed_values, wait_for_topic


def _settings_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.slow
def test_a_secured_cluster_commits_a_transaction_through_sasl_ssl_with_acls(tmp_path: Path, unique_name) -> None:
    data_dir, port = tmp_path / "secure-cluster", free_port(span=6)
    where = ["--brokers", "3", "--port", str(port), "--data-dir", str(data_dir)]
    started = time.monotonic()
    try:
        start = eos_subprocess("kafka", "start", *where, "--secure", timeout=400)
        start_s = time.monotonic() - started
        assert start.returncode == 0, start.output[-3000:]
        client_file = data_dir / "security" / "client.properties"
        assert str(client_file) in start.output
        admin_settings = _settings_file(client_file)
        assert admin_settings["sasl.password"] not in start.output
        assert admin_settings["security.protocol"] == "SASL_SSL"
        status = eos_subprocess("kafka", "status", *where, timeout=120)
        assert status.returncode == 0 and str(client_file) in status.output, status.output[-3000:]
        assert "brokers [1, 2, 3]" in status.output

        admin = admin_client(admin_settings)
        topic, txid, user = unique_name("t"), unique_name("tx"), unique_name("u")
        assert create_topic(admin, topic, 3)
        wait_for_topic(admin, topic, 3)
        password = "pw-" + unique_name("p")
        kafka_security.add_scram_user(admin, user, password)
        settings = kafka_security.user_settings(admin_settings["bootstrap.servers"], admin_settings["ssl.ca.location"],
                                                user, password)  # fmt: skip
        with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            producer({**settings, "transactional.id": txid}).init_transactions(30)

        # What a transactional producer needs, no more: its id, and the topic.
        principal = f"User:{user}"
        kafka_security.create_acls(admin, [
            Acl(principal, "TRANSACTIONAL_ID", txid, "WRITE"), Acl(principal, "TRANSACTIONAL_ID", txid, "DESCRIBE"),
            Acl(principal, "TOPIC", topic, "WRITE"), Acl(principal, "TOPIC", topic, "DESCRIBE"),
        ])  # fmt: skip
        out = producer({**settings, "transactional.id": unique_name("other")})
        with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            out.init_transactions(30)  # another id than the one granted
        out = producer({**settings, "transactional.id": txid})
        out.init_transactions(60)
        out.begin_transaction()
        for i in range(30):
            out.produce(topic, f"v{i}".encode(), f"k{i}".encode())
        out.commit_transaction(60)
        values = independent_committed_values(admin_settings["bootstrap.servers"], topic, settings=admin_settings)
        assert sorted(values) == sorted(f"v{i}" for i in range(30))
        print(f"\nsecured 3-node cluster: started in {start_s:.1f} s, whole test {time.monotonic() - started:.1f} s")
    finally:
        LocalCluster(port=port, data_dir=data_dir).stop()

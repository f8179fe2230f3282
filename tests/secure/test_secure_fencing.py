"""The wire fencer (eos_connectors.kafka.fencer) on the secured broker: SCRAM-SHA-512 over TLS,
the broker's certificate verified, the authorizer's refusals reported per id, and a wrong
password an error (never a silent success). tests/secure/test_secure_clients.py covers recovery's
fencing with several principals, which goes through the same path."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException

from eos_connectors.kafka import fencer
from eos_connectors.kafka.clients import create_topic, producer
from tests.support_secure import SecureKafka


def test_fencing_over_sasl_ssl_fences_a_zombie_and_reports_refusals(secure_kafka: SecureKafka, unique_name):
    allowed, nobody = unique_name("fencer"), unique_name("stranger")
    acls = secure_kafka.grant_all(allowed)
    try:
        settings = secure_kafka.settings(allowed)
        topic = unique_name("fenced")
        assert create_topic(secure_kafka.admin, topic, 1, 1)
        txids = [f"{unique_name('txn')}/out/{n}" for n in range(64)]
        zombie = producer({**settings, "transactional.id": txids[5]})
        zombie.init_transactions(30)
        zombie.begin_transaction()
        zombie.produce(topic, b"zombie", partition=0)
        zombie.flush(30)

        outcome = fencer.fence(settings, txids, 60)

        assert outcome.refused == [] and outcome.requests >= len(txids) + 1
        with pytest.raises(KafkaException, match=r"(?i)fenced|epoch"):
            zombie.commit_transaction(30)
        stranger = fencer.fence(secure_kafka.settings(nobody), txids[:3], 30)
        assert sorted(txid for txid, _ in stranger.refused) == sorted(txids[:3])
        assert {code for _, code in stranger.refused} <= fencer.REFUSED
        with pytest.raises(fencer.WireError, match="SASL authentication failed"):
            fencer.fence({**settings, "sasl.password": "not-the-password"}, txids[:1], 30)
        without_ca = {k: v for k, v in settings.items() if k != "ssl.ca.location"}
        with pytest.raises((fencer.WireError, OSError)):  # the system's CAs do not know the broker's
            fencer.fence(without_ca, txids[:1], 30)
    finally:
        secure_kafka.revoke(acls)

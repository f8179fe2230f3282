"""Recovery's fencing on the real broker: every id's zombie is fenced and its open transaction
aborted before fence() returns, over the wire path (eos_connectors.kafka.fencer) and over the
librdkafka path that settings the wire path does not implement take."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException

from eos_connectors.kafka import fencer, ledger
from eos_connectors.kafka.clients import admin_client, end_offsets, producer


def _zombies(bootstrap: str, topic: str, txids: list[str]) -> list:
    """A producer per id with a transaction open on `topic` (flushed, not committed), as crashed slots leave them."""
    open_ = []
    for txid in txids:
        zombie = producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
        zombie.init_transactions(30)
        zombie.begin_transaction()
        zombie.produce(topic, b"zombie", partition=0)
        zombie.flush(30)
        open_.append(zombie)
    return open_


def _nothing_open(bootstrap: str, topic: str) -> bool:
    admin = admin_client({"bootstrap.servers": bootstrap})
    stable = end_offsets(admin, {topic: [0]}, read_committed=True)
    high = end_offsets(admin, {topic: [0]}, read_committed=False)
    return stable == high and high[(topic, 0)] > 0


@pytest.mark.parametrize("path", ["wire", "producers"])
def test_fencing_aborts_every_open_transaction_and_fences_every_zombie(bootstrap, new_topic, unique_name, path):
    topic = new_topic(1)
    prefix = unique_name("fence")
    txids = [f"{prefix}/out/{n}" for n in range(300)]
    zombies = _zombies(bootstrap, topic, txids[::100])  # three of them hold a transaction open
    client = {"bootstrap.servers": bootstrap}
    if path == "producers":  # a setting the wire path does not implement: librdkafka producers fence
        client["socket.connection.setup.timeout.ms"] = 30000
        with pytest.raises(fencer.Unsupported):
            fencer.wire_settings(client)
    assert not _nothing_open(bootstrap, topic)

    ledger.fence(client, txids, 60)

    assert _nothing_open(bootstrap, topic)  # aborted before fence() returned: the ledger can be read
    for zombie in zombies:
        with pytest.raises(KafkaException, match=r"(?i)fenced|epoch"):
            zombie.commit_transaction(30)


def test_the_wire_path_sends_one_request_per_id_over_a_few_connections(bootstrap, unique_name):
    txids = [f"{unique_name('fence')}/out/{n}" for n in range(512)]
    ledger.fence({"bootstrap.servers": bootstrap}, txids, 60)  # every id exists now: what recovery meets

    outcome = fencer.fence({"bootstrap.servers": bootstrap}, txids, 60)

    assert outcome.refused == []
    assert outcome.requests == len(txids) + 1  # one FindCoordinator, one InitProducerId per id
    assert outcome.connections <= 1 + fencer.STRIPES  # against three per id with a producer each


def test_an_unreachable_cluster_is_an_error_not_a_fence(unique_name):
    with pytest.raises(fencer.WireError, match="no broker reachable"):
        fencer.fence({"bootstrap.servers": "127.0.0.1:1"}, [f"{unique_name('fence')}/out/0"], 5)

"""The broker really does transactions: read_committed hides aborted records, read_uncommitted
shows them. Everything eos promises rests on this, so it is pinned first."""

from __future__ import annotations

from eos_connectors.kafka.clients import producer
from tests.support import read_all


def test_read_committed_sees_only_committed_records(bootstrap, new_topic, unique_name):
    topic = new_topic(partitions=2)
    txn = producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn")})
    txn.init_transactions(30)

    txn.begin_transaction()
    for i in range(10):
        txn.produce(topic, key=f"k{i}".encode(), value=f"committed-{i}".encode())
    txn.commit_transaction(30)

    txn.begin_transaction()
    for i in range(5):
        txn.produce(topic, key=f"k{i}".encode(), value=f"aborted-{i}".encode())
    txn.flush(30)  # the aborted records really reach the log before the abort
    txn.abort_transaction(30)

    txn.begin_transaction()
    txn.produce(topic, key=b"k-last", value=b"committed-last")
    txn.commit_transaction(30)

    committed = sorted(m.value().decode() for m in read_all(bootstrap, topic, "read_committed"))
    everything = sorted(m.value().decode() for m in read_all(bootstrap, topic, "read_uncommitted"))

    expected_committed = sorted([f"committed-{i}" for i in range(10)] + ["committed-last"])
    assert committed == expected_committed
    assert everything == sorted(expected_committed + [f"aborted-{i}" for i in range(5)])


def test_open_transaction_is_invisible_until_commit(bootstrap, new_topic, unique_name):
    topic = new_topic()
    txn = producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn")})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"pending")
    txn.flush(30)

    assert read_all(bootstrap, topic, "read_committed") == []
    assert [m.value() for m in read_all(bootstrap, topic, "read_uncommitted")] == [b"pending"]

    txn.commit_transaction(30)
    assert [m.value() for m in read_all(bootstrap, topic, "read_committed")] == [b"pending"]


def test_a_range_that_ends_on_markers_or_aborted_records_reads_exactly_its_records(bootstrap, new_topic, unique_name):
    """The source reads planned ranges [start, end) that may end on a transaction marker or inside
    aborted records (offsets that are never delivered). Every such range must finish, and hold
    exactly the committed records whose offsets lie in it."""
    from confluent_kafka import TopicPartition

    from eos_connectors.kafka.range_reader import range_consumer, read_range

    topic = new_topic(partitions=1)
    txn = producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn")})
    txn.init_transactions(30)
    for values, commit in ((["c0", "c1", "c2"], True), (["a0", "a1"], False), (["c3"], True)):
        txn.begin_transaction()
        for value in values:
            txn.produce(topic, value=value.encode())
        txn.flush(30)
        txn.commit_transaction(30) if commit else txn.abort_transaction(30)

    committed = {m.offset(): m.value().decode() for m in read_all(bootstrap, topic, "read_committed")}
    reader = range_consumer({"bootstrap.servers": bootstrap})
    try:
        end = reader.get_watermark_offsets(TopicPartition(topic, 0), 10)[1]
        assert end == 9  # 3 records, a marker, 2 aborted, a marker, 1 record, a marker
        ranges = [(0, e) for e in range(end + 1)] + [(s, end) for s in range(end + 1)]
        for start, stop in ranges:
            got = [m.value().decode() for batch in read_range(reader, topic, 0, start, stop) for m in batch]
            assert got == [v for o, v in sorted(committed.items()) if start <= o < stop], (start, stop)
    finally:
        reader.close()

"""The Kafka sink's producers against a real broker: a producer is never used again after an
error whose outcome is unknown (issue 10, item 10), and at-least-once never drops a record."""

from __future__ import annotations

import os
import signal
import time

import pyarrow as pa
import pytest

from eos.errors import SlotAborted
from eos.protocol.ledger import LedgerEntry
from eos.protocol.sink import Lease, PipelineInfo, SlotContext
from eos_connectors.kafka import sink as kafka_sink
from eos_connectors.kafka.clients import admin_client, create_topic
from eos_connectors.kafka.ledger import ensure_ledger_topic
from eos_connectors.kafka.sink import KafkaWriterFactory
from tests.support import read_all, start_local_broker


class Context(SlotContext):
    """The slot's side of the protocol, as a test drives it: every lease is id 0."""

    def __init__(self, fresh: bool):
        self.pipeline = PipelineInfo("p", "ck", True, 5.0)
        self.sink, self.slot, self.epoch, self.attempt, self.task_attempt, self.worker = "out", 0, 1, 1, 0, "w"
        self.fresh = fresh

    def lease(self, idle: list[int]) -> Lease:
        return Lease(0, self.fresh or 0 not in idle)

    def hit(self, point: str) -> None:
        pass


def _rows(values: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([b"k"] * len(values), pa.binary()),
            "value": pa.array([v.encode() for v in values], pa.binary()),
            "headers": pa.array(
                [[]] * len(values), pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
            ),
        }
    )


def _entry(epoch: int) -> LedgerEntry:
    return LedgerEntry("p", "out", 0, epoch, "ck", "offsets", "config")


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test alone: it gets paused."""
    kafka = start_local_broker(tmp_path / "broker")
    try:
        yield kafka
    finally:
        os.kill(kafka.broker.pid(), signal.SIGCONT)  # type: ignore[attr-defined]
        kafka.close()


def test_a_producer_that_timed_out_mid_commit_is_discarded_and_its_id_reinitialised(own_broker, unique_name):
    bootstrap = own_broker.bootstrap
    topic, ledger = unique_name("out"), unique_name("ledger")
    create_topic(admin_client({"bootstrap.servers": bootstrap}), topic, 1)
    ensure_ledger_topic({"bootstrap.servers": bootstrap}, ledger)
    factory = KafkaWriterFactory(
        sink="out", topic=topic, client={"bootstrap.servers": bootstrap, "request.timeout.ms": 2000},
        prefix=f"eos/{unique_name('t')}", ledger_topic=ledger, exactly_once=True, timeout_s=5.0, codecs={},
    )  # fmt: skip
    writer = factory.open(Context(fresh=True))
    writer.write(_rows(["first-1", "first-2"]))
    writer.precommit(_entry(1))
    first_instance = writer.entry.instance

    pid = own_broker.broker.pid()
    os.kill(pid, signal.SIGSTOP)  # a pause, not a crash: requests stay in flight
    try:
        with pytest.raises(SlotAborted):
            writer.commit()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (factory.prefix, "out", 0) not in kafka_sink._producers, "a producer with an unknown outcome stayed in use"

    # The next lease of id 0 initialises a new producer: init_transactions bumps the epoch and
    # settles the old transaction (committed if its EndTxn landed, else aborted) before it returns.
    retry = factory.open(Context(fresh=False))
    assert retry.entry.instance is not first_instance and not retry.reused
    time.sleep(0.5)
    first = [m.value() for m in read_all(bootstrap, topic)]
    in_ledger = [m for m in read_all(bootstrap, ledger) if m.value() and b'"epoch": 1' in m.value()]
    assert first in ([], [b"first-1", b"first-2"]), first  # all or nothing
    assert bool(first) == bool(in_ledger)  # the ledger says exactly what happened
    retry.write(_rows(["second"]))
    retry.precommit(_entry(2))
    retry.commit()
    assert [m.value() for m in read_all(bootstrap, topic)][-1] == b"second"


def test_at_least_once_delivery_errors_fail_the_slot(bootstrap, admin, unique_name):
    """Before, the at-least-once path ignored delivery reports: a record the broker refused was
    silently missing from a 'successful' epoch."""
    topic = unique_name("small")
    create_topic(admin, topic, 1, config={"max.message.bytes": "64"})
    factory = KafkaWriterFactory(
        sink="out", topic=topic, client={"bootstrap.servers": bootstrap, "compression.type": "none"},
        prefix="unused", ledger_topic="unused", exactly_once=False, timeout_s=20.0, codecs={},
    )  # fmt: skip
    writer = factory.open(Context(fresh=True))
    writer.write(_rows(["x" * 300]))
    with pytest.raises(SlotAborted, match="not delivered"):
        writer.precommit(_entry(1))


def test_two_pipelines_with_a_sink_of_the_same_name_never_share_a_producer(bootstrap, admin, unique_name):
    """Before, a Python worker's producers were keyed by (sink name, pool number): a second pipeline
    in the same Spark application with a sink also called `out` leased the first one's idle
    producer, and wrote under the first pipeline's transactional id."""
    ledger = unique_name("ledger")
    ensure_ledger_topic({"bootstrap.servers": bootstrap}, ledger)
    writers = []
    for name in ("a", "b"):
        topic = unique_name(f"out-{name}")
        create_topic(admin, topic, 1)
        factory = KafkaWriterFactory(
            sink="out", topic=topic, client={"bootstrap.servers": bootstrap},
            prefix=f"eos/{unique_name(name)}", ledger_topic=ledger, exactly_once=True, timeout_s=20.0, codecs={},
        )  # fmt: skip
        writer = factory.open(Context(fresh=name == "a"))  # b's lease says: reuse your idle id 0
        writer.write(_rows([name]))
        writer.precommit(_entry(1))
        writer.commit()
        writers.append(writer)
    a, b = writers
    assert not b.reused and b.entry.instance is not a.entry.instance
    assert b.entry.txid.startswith(b.factory.prefix) and a.entry.txid.startswith(a.factory.prefix)
    assert [m.value() for m in read_all(bootstrap, b.factory.topic)] == [b"b"]


def test_transactional_producers_connect_to_every_broker_at_creation(bootstrap, admin, unique_name):
    """A transactional producer with sparse connections (librdkafka's default) reaches its
    transaction coordinator only when init_transactions asks for it, and often waits for
    librdkafka's 500 ms PID retry timer. eos's transactional producers (sinks, control log,
    fencing) connect to every broker at creation; a user's own setting still wins."""
    from eos_connectors.kafka.clients import producer, producer_config

    base = {"bootstrap.servers": bootstrap}
    assert producer_config({**base, "transactional.id": "t"})["enable.sparse.connections"] is False
    assert "enable.sparse.connections" not in producer_config(base)
    mine = {**base, "transactional.id": "t", "enable.sparse.connections": True}
    assert producer_config(mine)["enable.sparse.connections"] is True
    # ... and such a producer runs a transaction (the broker accepts the setting's connections)
    topic = unique_name("sparse")
    create_topic(admin, topic, 1)
    instance = producer({**base, "transactional.id": unique_name("sparse-txn")})
    instance.init_transactions(30)
    instance.begin_transaction()
    instance.produce(topic, b"x")
    instance.commit_transaction(30)
    assert [m.value() for m in read_all(bootstrap, topic)] == [b"x"]

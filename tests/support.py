"""Test support: starting the Kafka under test, reading topics back."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class KafkaUnderTest:
    bootstrap: str
    kind: str  # "external", "container" or "local"
    _close: Any = field(default=None, repr=False)

    def close(self) -> None:
        if self._close is not None:
            self._close()


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def start_kafka_under_test(workdir: Path) -> KafkaUnderTest:
    if os.environ.get("EOS_KAFKA_BOOTSTRAP"):
        return KafkaUnderTest(os.environ["EOS_KAFKA_BOOTSTRAP"], "external")
    if docker_answers():
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer("confluentinc/cp-kafka:7.7.1").with_kraft()
        container.start()
        return KafkaUnderTest(container.get_bootstrap_server(), "container", container.stop)
    return start_local_broker(workdir)


def start_local_broker(workdir: Path, heap: str = "512m") -> KafkaUnderTest:
    from eos_ops.localkafka import LocalBroker, free_port

    broker = LocalBroker(port=free_port(), data_dir=workdir / "broker", heap=heap)
    broker.start(progress=print)
    under_test = KafkaUnderTest(broker.bootstrap, "local", lambda: broker.stop(kill=False))
    under_test.broker = broker  # type: ignore[attr-defined]
    return under_test


@dataclass
class ClusterUnderTest:
    """The local three-node KRaft cluster: `bootstrap` (all three brokers) for clients, `cluster` (an
    eos_ops.localkafka.LocalCluster) for fault injection: kill, pause, resume, restart, and who leads."""

    bootstrap: str
    cluster: Any
    start_seconds: float

    def close(self) -> None:
        self.cluster.stop()


def start_kafka_cluster_under_test(workdir: Path, heap: str = "384m") -> ClusterUnderTest:
    """Start a LocalCluster in `workdir` on free ports. Always the embedded cluster, never
    EOS_KAFKA_BOOTSTRAP or a container: fault injection needs the nodes' processes at hand."""
    import time

    from eos_ops.localkafka import LocalCluster, free_port

    cluster = LocalCluster(port=free_port(span=6), data_dir=workdir / "cluster", heap=heap)
    started = time.monotonic()
    cluster.start(progress=print)
    return ClusterUnderTest(cluster.bootstrap, cluster, time.monotonic() - started)


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every message of a topic up to its current end (LSO for read_committed, else the high
    watermark), in partition and offset order."""
    from eos_connectors.kafka.clients import admin_client, describe_partitions, end_offsets
    from eos_connectors.kafka.range_reader import range_consumer, read_range

    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=isolation == "read_committed")
    reader = range_consumer({"bootstrap.servers": bootstrap}, isolation == "read_committed")
    messages: list[Any] = []
    try:
        for partition in partitions[topic]:
            for batch in read_range(reader, topic, partition, 0, ends[(topic, partition)]):
                messages.extend(batch)
    finally:
        reader.close()
    return messages


def independent_committed_values(
    bootstrap: str, topic: str, timeout_s: float = 60.0, settings: dict | None = None, raw: bool = False
) -> list[Any]:
    """The committed values of `topic`, read by a second reader that shares no code with eos
    (`eos verify` included): a plain confluent-kafka group consumer, read_committed, subscribed
    from the earliest offset until every partition reports end of partition. `settings`: more
    client settings (a secured cluster's); raw: the values as bytes, not decoded."""
    import time
    import uuid

    from confluent_kafka import Consumer, KafkaError

    reader = Consumer({
        **(settings or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"independent-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })  # fmt: skip
    try:
        partitions = set(reader.list_topics(topic, timeout=10).topics[topic].partitions)
        reader.subscribe([topic])
        values: list[Any] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while at_end != partitions:
            assert time.monotonic() < deadline, f"{topic}: no end of partition for {partitions - at_end}"
            message = reader.poll(1.0)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            values.append(message.value() if raw else message.value().decode())
        return values
    finally:
        reader.close()


def wait_for_topic(admin, topic: str, partitions: int) -> dict:
    """The topic's partition metadata once every partition has a leader: CreateTopics returns when the
    controller has committed the topic, and brokers learn of it a moment later."""

    def described():
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        ready = found is not None and found.error is None and len(found.partitions) == partitions
        return found.partitions if ready and all(p.leader >= 0 for p in found.partitions.values()) else None

    return wait_for(described, 30, f"topic {topic} in the metadata")


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)


class Later:
    """Runs `action` after `delay_s` on a thread of its own (a node restarted while the test goes
    on). `join()` waits for it and raises what it raised: a failed restart fails the test instead of
    ending as a warning about a thread, and joining before the next fault keeps faults from landing
    inside a restart that is still waiting for the cluster to heal."""

    def __init__(self, delay_s: float, action: Callable[[], object]) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            time.sleep(delay_s)
            try:
                action()
            except BaseException as exc:  # handed to join()
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout: float = 300.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout:.0f} s"
        if self.error is not None:
            raise self.error

"""The benchmark's input, generated on the local broker, and counting what came out.

The input is the demo's ad events (eos_ops.demo.generate_events: Avro `AdEvent`, 8% duplicates,
5% late, a heartbeat at the end that closes every window), keyed by event_id so every
partition gets the same share. Both pipelines read the same topic, and every configuration
of a row reads the same records.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from eos.errors import EnvironmentProblem
from eos.paths import schemas_dir
from eos_connectors.kafka.clients import (
    admin_client,
    create_topic,
    describe_partitions,
    end_offsets,
    producer,
)
from eos_connectors.kafka.range_reader import range_consumer, read_range
from eos_ops.demo import EVENT_SCHEMA, avro_schema, generate_events


@dataclass(frozen=True)
class Input:
    topic: str
    partitions: int
    records: int  # records written (= offsets: the generator writes no transactions)
    events: int  # distinct events generated
    value_bytes_mean: float
    windows_expected: int  # campaign-minute windows of the ground truth (stateful pipeline)


def write_records(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], partition_of: Any = None) -> None:
    out = producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    for key, value in records:
        while True:
            try:
                if partition_of is None:
                    out.produce(topic, value, key)
                else:
                    out.produce(topic, value, key, partition=partition_of(key))
                break
            except BufferError:
                out.poll(0.05)
    if out.flush(120):
        raise EnvironmentProblem(f"could not write the benchmark input to {topic} at {bootstrap}")


def encode_event(event: dict[str, Any], schema: Any) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, schema, {**event, "event_time": datetime.fromtimestamp(event["event_time"] / 1000, tz=timezone.utc)}
    )
    return out.getvalue()


def hot_partitioner(partitions: int, hot: int):
    """key -> partition: partition 0 takes `hot` shares, every other partition one (a stable hash
    of the key, so a duplicate lands where its original did)."""
    import zlib

    buckets = hot + partitions - 1

    def partition_of(key: bytes) -> int:
        bucket = zlib.crc32(key) % buckets
        return 0 if bucket < hot else bucket - hot + 1

    return partition_of


def make_input(bootstrap: str, topic: str, partitions: int, events: int, seed: int = 7, hot: int = 1) -> Input:
    """Create `topic` and fill it with `events` ad events (plus duplicates and a heartbeat).
    `hot` > 1: partition 0 gets `hot` times the records of each other partition."""
    if not create_topic(admin_client({"bootstrap.servers": bootstrap}), topic, partitions):
        raise EnvironmentProblem(f"input topic {topic} exists already; the benchmark writes its input once, fresh")
    generated, truth = generate_events(events, seed)
    schema = avro_schema(EVENT_SCHEMA)
    records = [(e["event_id"].encode(), encode_event(e, schema)) for e in generated]
    write_records(bootstrap, topic, records, hot_partitioner(partitions, hot) if hot > 1 else None)
    mean = sum(len(v) for _, v in records) / len(records)
    return Input(topic, partitions, len(records), events, round(mean, 1), len(truth.expected_counts()))


def ready_topic(bootstrap: str, name: str, partitions: int, timeout_s: float = 60.0) -> None:
    """Create a topic and wait until every partition answers a ListOffsets: a pipeline started on a
    topic created a moment ago can fail to pin its start offsets with NOT_LEADER_FOR_PARTITION
    (eos does not retry that at start-up; see the notes)."""
    from confluent_kafka import KafkaException

    from eos_connectors.kafka.clients import start_offsets

    admin = admin_client({"bootstrap.servers": bootstrap})
    create_topic(admin, name, partitions)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            start_offsets(admin, {name: list(range(partitions))})
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def live_event(n: int, seed: int, now_ms: int, rng) -> dict[str, Any]:
    """An ad event happening now (latency and memory runs): event_time is the produce time."""
    return {
        "event_id": f"live-{seed}-{n}",
        "event_type": "click" if rng.random() < 0.12 else "impression",
        "campaign_id": f"campaign-{rng.randrange(8):02d}",
        "user_id": f"user-{rng.randrange(5000)}",
        "event_time": now_ms,
    }


def count_records(bootstrap: str, topic: str, read_committed: bool = True, settle_s: float = 30.0) -> int:
    """How many records a read_committed (or read_uncommitted) reader sees in `topic`.

    read_committed: first waits (up to `settle_s`) until nothing is open on the topic (the last
    stable offset reached the high watermark). `commit_transaction` returns before the broker has
    written the commit markers to every partition, so counting right after a run's last commit
    could see part of it, or none."""
    client = {"bootstrap.servers": bootstrap}
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    if read_committed:
        high = end_offsets(admin, partitions, read_committed=False)
        deadline = time.monotonic() + settle_s
        while True:
            ends = end_offsets(admin, partitions, read_committed=True)
            if all(ends[tp] >= high[tp] for tp in high) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    else:
        ends = end_offsets(admin, partitions, read_committed=False)
    reader = range_consumer(client, read_committed)
    seen = 0
    try:
        for partition in partitions[topic]:
            for batch in read_range(reader, topic, partition, 0, ends[(topic, partition)]):
                seen += len(batch)
    finally:
        reader.close()
    return seen


def eos_topics(name: str) -> list[str]:
    """The topics an eos pipeline called `name` makes beside its output: its ledger (the default
    `ledger.topic`) and its control log."""
    return [f"eos-ledger-{name}", f"eos-ledger-{name}.control"]


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Drop a run's output and ledger topics, so later runs find the broker as the first did."""
    admin = admin_client({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in topics if t in existing]
    if not doomed:
        return
    for future in admin.delete_topics(doomed, operation_timeout=30).values():
        with contextlib.suppress(Exception):  # best effort: a leftover topic only costs disk
            future.result()
    deadline = time.monotonic() + 30
    while set(doomed) & set(admin.list_topics(timeout=10).topics) and time.monotonic() < deadline:
        time.sleep(0.2)


def schema_json(name: str) -> dict[str, Any]:
    return json.loads((schemas_dir() / name).read_text())


def expected_stateless_out(bootstrap: str, topic: str) -> int:
    """How many records the stateless pipeline must output for `topic` (its filter, applied here
    with fastavro directly)."""
    import fastavro

    schema = fastavro.parse_schema(schema_json(EVENT_SCHEMA))
    client = {"bootstrap.servers": bootstrap}
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    reader = range_consumer(client)
    kept = 0
    try:
        for partition in partitions[topic]:
            for batch in read_range(reader, topic, partition, 0, ends[(topic, partition)]):
                for message in batch:
                    event = fastavro.schemaless_reader(io.BytesIO(message.value()), schema, None)
                    kept += event["event_type"] != "heartbeat" and event["campaign_id"] != "campaign-00"
    finally:
        reader.close()
    return kept

"""Reading topics back to check exactly-once claims (`eos verify`, the demo, the tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.kafka_clients import admin_client, consumer, describe_partitions, end_offsets
from connectors.range_reader import read_range


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def read_topic(bootstrap: str | dict[str, Any], topic: str, read_committed: bool = True) -> list[Record]:
    """Every record of `topic` from the start to its current end: the last stable offset for
    read_committed (aborted records and open transactions are invisible), else the high
    watermark (everything written, aborted records included)."""
    client = {"bootstrap.servers": bootstrap} if isinstance(bootstrap, str) else dict(bootstrap)
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=read_committed)
    reader = consumer({**client, "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    records: list[Record] = []
    try:
        for partition in partitions[topic]:
            for batch in read_range(reader, topic, partition, 0, ends[(topic, partition)]):
                records.extend(
                    Record(topic, partition, m.offset(), m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1])
                    for m in batch
                )
    finally:
        reader.close()
    return records

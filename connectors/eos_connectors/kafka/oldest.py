"""How long the records a pipeline has not committed yet have waited: the Kafka timestamp of the
first readable record at each lagging partition's committed position (the record the next epoch
reads first), for the lag monitor and `eos status`.

One consumer per source, kept for the monitor's life (it runs on the monitor's thread only),
assigned to the lagging partitions at their committed offsets for one short read, then unassigned.
It reads as the source does (read_committed: aborted records and transaction markers are never
the answer), and as little as it can: one small fetch per partition, no prefetching queue. A
partition that does not answer within the time given has no age this round.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from eos_connectors.kafka.clients import consumer

# One small fetch per partition: the first record is all it needs (a broker still returns a whole
# first batch when that is larger). With a queue this short, librdkafka postpones the next fetch by
# fetch.queue.backoff.ms once it holds a record (1 s by default, and what an unassigned partition
# left still counts): every read after the first took 1.0 s instead of 7 ms.
PEEK_SETTINGS: dict[str, Any] = {
    "fetch.max.bytes": 1024 * 1024,
    "max.partition.fetch.bytes": 64 * 1024,
    "queued.min.messages": 1,
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 10,
    "enable.partition.eof": False,
}
PEEK_TIMEOUT_S = 1.0


def peek_consumer(client: Mapping[str, Any], read_committed: bool) -> Any:
    isolation = "read_committed" if read_committed else "read_uncommitted"
    return consumer({**client, "isolation.level": isolation}, **PEEK_SETTINGS)


def oldest_timestamps(
    reader: Any, positions: Mapping[tuple[str, int], int], timeout_s: float = PEEK_TIMEOUT_S
) -> dict[tuple[str, int], float]:
    """For each (topic, partition) at its offset, the timestamp (Unix seconds) of the first record
    `reader` can read from there, if one arrives within `timeout_s`."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, TopicPartition

    if not positions:
        return {}
    reader.assign([TopicPartition(topic, partition, offset) for (topic, partition), offset in positions.items()])
    found: dict[tuple[str, int], float] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < len(positions) and (left := deadline - time.monotonic()) > 0:
            for message in reader.consume(len(positions), min(left, 0.1)):
                key = (message.topic(), message.partition())
                if message.error() is not None or key in found or key not in positions:
                    continue
                kind, millis = message.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE and millis >= 0:
                    found[key] = millis / 1000
    finally:
        reader.unassign()
    return found

"""Reading one partition's planned offset range [start, end) exactly.

Kafka offsets are not contiguous: transaction markers and (for read_committed) aborted
records occupy offsets that are never delivered. So a range is finished when the consumer's
position reaches `end`, never when "end - start records" have been read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

# Fetch settings for reading planned ranges (every range_consumer, and the raw-loop benchmark
# baseline). A range ends where the epoch's plan says, with more records usually right after it,
# and everything librdkafka fetches past the end is parsed and thrown away:
# - Short fetches, a short queue. librdkafka keeps fetching until `queued.min.messages` are
#   queued (default 100,000) or the queue holds `queued.max.messages.kbytes`: with 16 MB fetches
#   and a 256 MB queue, reading 12,500 records of a large partition cost 65-320 ms of CPU.
# - No long queue backoff. A queue over those thresholds postpones the next fetch by
#   `fetch.queue.backoff.ms` (1 s by default), and what an unassigned partition left in the queue
#   still counts, so the next range waited a second.
# - Almost no long poll. Once a range's last records arrive, librdkafka has already sent the next
#   fetch, which the broker holds up to `fetch.wait.max.ms` when nothing more is there, and the
#   next range's fetch (one in flight per broker) waits for it: 54 ms per range at 50 ms.
# Measured on a 330,000-record and a 33,000-record partition, 16 ranges of 12,500 records read one
# after the other by one consumer, switching partitions: 3.1-3.3 s (1.0-1.2 s of CPU) before,
# 0.19-0.20 s (0.17 s of CPU) with these; one 200,000-record range 170-181 -> 147-149 ms.
FETCH_TUNING: dict[str, Any] = {
    "fetch.max.bytes": 8 * 1024 * 1024,
    "max.partition.fetch.bytes": 1024 * 1024,
    "queued.max.messages.kbytes": 8 * 1024,
    "queued.min.messages": 10_000,
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 2,
}


# How long one consume() waits for a batch to fill (see read_range): short, because the
# position moves past undelivered offsets only between calls.
POLL_S = 0.01


def range_consumer(client: dict[str, Any], read_committed: bool = True, **settings: Any) -> Any:
    """A consumer for read_range: unassigned (read_range assigns it one partition at a time),
    tuned by FETCH_TUNING where `client` does not say otherwise."""
    from eos_connectors.kafka.clients import consumer

    isolation = "read_committed" if read_committed else "read_uncommitted"
    return consumer({**client, "isolation.level": isolation}, **{**FETCH_TUNING, **settings})


class RangeReadError(Exception):
    """Reading a planned range failed: out of range (retention), stalled, or a broker error."""


def read_range(
    consumer: Any,
    topic: str,
    partition: int,
    start: int,
    end: int,
    batch_size: int = 10_000,
    stall_timeout_s: float = 120.0,
) -> Iterator[list[Any]]:
    """Yield lists of messages with start <= offset < end, in offset order.

    `consumer` must be unassigned; it is assigned to this partition only."""
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    tp = TopicPartition(topic, partition, start)
    consumer.assign([tp])
    last_progress = time.monotonic()
    position = start
    try:
        while position < end:
            # Ask for no more than the range can still hold: consume(n, timeout) returns early only
            # when it has n messages. Transaction markers and aborted records take offsets but are
            # never delivered, so a range of transactional records holds fewer than `end -
            # position` messages and every call at its tail waits out the whole timeout; the
            # position check below then finishes the range. Hence a short timeout: with 0.1 s,
            # every read of a control log or ledger (a marker after each record) took 101 ms.
            messages = consumer.consume(max(1, min(batch_size, end - position)), POLL_S)
            batch = []
            done = False
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    if error.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                        raise RangeReadError(
                            f"offset {position} of {topic}/{partition} is out of range (deleted by retention "
                            f"or the topic was recreated); the epoch planned [{start}, {end})"
                        )
                    if error.fatal() or not error.retriable():
                        raise RangeReadError(f"reading {topic}/{partition} failed: {error}")
                    continue
                if message.offset() >= end:
                    done = True
                    break
                batch.append(message)
            if batch:
                position = batch[-1].offset() + 1
                last_progress = time.monotonic()
                yield batch
            if done:
                return
            # The position moves past markers and aborted records that were never delivered.
            current = consumer.position([TopicPartition(topic, partition)])[0].offset
            if current > position:
                position = current
                last_progress = time.monotonic()
            if time.monotonic() - last_progress > stall_timeout_s:
                raise RangeReadError(
                    f"no progress reading {topic}/{partition} at offset {position} for {stall_timeout_s:.0f} s "
                    f"(planned end {end}); is a transaction holding the last stable offset back?"
                )
    finally:
        consumer.unassign()

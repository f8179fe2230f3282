"""The ledger: the last epoch each (pipeline, sink, slot) committed, kept in Kafka itself.

Each slot writes its ledger record inside the same transaction as its output, so the record is
visible (read_committed) exactly when the output is. On recovery the driver first fences every
transactional id of the pipeline (aborting whatever a dead or stalled attempt left open), then
reads the ledger; a slot whose ledger says it committed epoch N writes nothing when N replays.

The topic is compacted (the latest record per key is all that matters) and, by default, one per
pipeline: a read_committed reader cannot pass another pipeline's open transaction, and recovery
must never wait on, or miss records behind, someone else's transaction.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from eos.errors import CheckpointError, EnvironmentProblem
from eos_connectors.kafka.clients import (
    admin_client,
    consumer,
    create_topic,
    describe_partitions,
    end_offsets,
    producer,
)
from eos_connectors.kafka.range_reader import read_range

log = logging.getLogger("eos_connectors.kafka.ledger")

LEDGER_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.1",
    "segment.ms": str(6 * 3600 * 1000),
}


@dataclass(frozen=True)
class LedgerEntry:
    pipeline: str
    sink: str
    slot: int
    epoch: int
    checkpoint: str
    records: int = 0
    attempt: int = 1
    producer: str = ""
    written_at: float = 0.0

    @classmethod
    def parse(cls, value: bytes) -> LedgerEntry:
        data = json.loads(value)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


Ledger = dict[tuple[str, int], LedgerEntry]


def ensure_ledger_topic(client: dict[str, Any], topic: str) -> bool:
    admin = admin_client(client)
    return create_topic(admin, topic, 1, config=LEDGER_TOPIC_CONFIG)


def fence(client: dict[str, Any], transactional_ids: Iterable[str], timeout_s: float = 60.0) -> float:
    """init_transactions on every id: bumps its producer epoch (fencing zombies) and aborts any
    transaction it left open. Returns the seconds it took."""
    ids = list(transactional_ids)
    started = time.monotonic()

    def one(txid: str) -> None:
        instance = producer({**client, "transactional.id": txid})
        try:
            instance.init_transactions(timeout_s)
        finally:
            instance.close(5)

    if ids:
        with ThreadPoolExecutor(max_workers=min(16, len(ids))) as pool:
            for _ in pool.map(one, ids):
                pass
    return time.monotonic() - started


def read_ledger(client: dict[str, Any], topic: str, pipeline: str, wait_s: float = 120.0) -> Ledger:
    """The latest committed entry of each (sink, slot) of `pipeline`.

    Call after `fence`: then nothing of this pipeline is open, and read_committed up to the high
    watermark sees every committed record. If another writer's transaction holds the last stable
    offset back, wait for it (bounded) rather than read a prefix and miss a commit."""
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    deadline = time.monotonic() + wait_s
    high = end_offsets(admin, partitions, read_committed=False)
    while True:
        stable = end_offsets(admin, partitions, read_committed=True)
        if all(stable[tp] >= high[tp] for tp in high):
            break
        if time.monotonic() > deadline:
            raise EnvironmentProblem(
                f"the ledger topic {topic} has an open transaction that is not this pipeline's and did not "
                f"finish within {wait_s:.0f} s; its last stable offset is stuck at {stable}",
                hint="another writer uses this ledger topic; give each pipeline its own (ledger.topic)",
            )
        time.sleep(0.2)
    return scan_ledger(client, topic, pipeline, {p: end for (_, p), end in high.items()})


def scan_ledger(client: dict[str, Any], topic: str, pipeline: str, ends: dict[int, int], strict: bool = True) -> Ledger:
    """The latest entry of each (sink, slot) of `pipeline` among the committed records below
    `ends` (partition -> offset). strict: an unreadable ledger record is an error (recovery);
    otherwise it is skipped (status reports)."""
    entries: Ledger = {}
    prefix = f"{pipeline}/".encode()
    reader = consumer({**client, "isolation.level": "read_committed"})
    try:
        for partition, end in ends.items():
            for batch in read_range(reader, topic, partition, 0, end, stall_timeout_s=120 if strict else 30):
                for message in batch:
                    key, value = message.key(), message.value()
                    if key is None or value is None or not key.startswith(prefix):
                        continue
                    try:
                        entry = LedgerEntry.parse(value)
                    except (ValueError, TypeError, KeyError) as exc:
                        if not strict:
                            continue
                        raise CheckpointError(
                            f"ledger topic {topic}: unreadable record at offset {message.offset()}: {exc}"
                        ) from exc
                    slot_key = (entry.sink, entry.slot)
                    if slot_key not in entries or entry.epoch >= entries[slot_key].epoch:
                        entries[slot_key] = entry
    finally:
        reader.close()
    return entries

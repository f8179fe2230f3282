"""The ledger topic: where Kafka sinks keep their ledger entries, and the control log its records.

A slot's entry is a record keyed `<pipeline>/<sink>/<slot>` written in the same transaction as
the slot's output, so it is visible (read_committed) exactly when the output is. The topic is
compacted (the latest entry per key is all that matters) and one per pipeline by default: a
read_committed reader cannot pass another pipeline's open transaction, and recovery must never
wait on, or miss records behind, someone else's transaction.

Durability: the ledger is what stops a replay from writing an epoch twice, so it is replicated
like the data it protects: replication min(3, brokers) and `min.insync.replicas` 2 where there
are three or more brokers. An existing ledger topic is checked: one that is not compacted only
(`cleanup.policy=compact`; `compact,delete` also deletes by retention) is refused: after an
outage longer than its retention the entries and the decision would be gone and a replay would
write committed epochs again. One with fewer replicas than the cluster allows is reported.

Forgetting a pipeline (`eos reset`) writes a tombstone for each of its keys, and every reader
here takes a tombstone as "no entry". The topic itself is never deleted, not even eos's default
one: a `ledger.topic` may name any topic, so whether other pipelines' entries are in it (or are
about to be) cannot be known at the moment of a deletion; a pipeline's principal then needs no
right to delete topics; and a deleted topic is gone only a while later, so the next run could
race its deletion, where it finds tombstones and starts cleanly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eos.api import CheckpointError, ConfigError, EnvironmentProblem, Ledger, LedgerEntry
from eos_connectors.kafka import fencer
from eos_connectors.kafka.clients import (
    TopicInfo,
    UnknownTopic,
    admin_client,
    broker_count,
    create_topic,
    describe_topics,
    end_offsets,
    is_refused,
    producer,
    topic_settings,
)
from eos_connectors.kafka.range_reader import range_consumer, read_range

log = logging.getLogger("eos.ledger")

CONTROL = "~control"  # key component of control records: never a sink name


def entry_key(pipeline: str, sink: str, slot: int) -> bytes:
    return f"{pipeline}/{sink}/{slot}".encode()


def control_key(pipeline: str, kind: str) -> bytes:
    return f"{pipeline}/{CONTROL}/{kind}".encode()


def ensure_ledger_topic(client: dict[str, Any], topic: str, admin: Any = None) -> None:
    admin = admin or admin_client(client)
    # Usually the topic exists: its description, its settings and the cluster's size are asked
    # for at once, one round trip instead of four in a row (this runs at every start).
    with ThreadPoolExecutor(max_workers=3) as pool:
        asked_brokers = pool.submit(broker_count, admin)
        asked_topic = pool.submit(_described, admin, topic)
        asked_settings = pool.submit(topic_settings, admin, topic)  # fails if there is no topic
    brokers = asked_brokers.result()
    replication = min(3, brokers)
    have = asked_topic.result()
    if have is None:
        config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", "segment.ms": str(6 * 3600 * 1000)}
        if brokers >= 3:
            config["min.insync.replicas"] = "2"
        if create_topic(admin, topic, 1, replication, config=config):
            return
        # It exists: someone else created it in the meantime, or a moment ago and the broker asked
        # had not learnt of it yet. Check theirs.
        settings, have = _once_visible(admin, topic)
    else:
        try:
            settings = asked_settings.result()
        except UnknownTopic:  # a broker that has not yet learnt of the topic the describe found
            settings, have = _once_visible(admin, topic)
    policy = settings.get("cleanup.policy", "")
    if {part.strip() for part in policy.split(",")} != {"compact"}:
        raise ConfigError(
            f"the ledger topic {topic} has cleanup.policy={policy}: retention would delete ledger entries (after "
            "an outage longer than it, the entries and the decision), and a replay after that would write committed "
            "epochs again",
            hint=f"set cleanup.policy=compact on {topic} (kafka-configs --alter), or use another ledger.topic",
        )
    if have.replication < replication:
        message = (
            f"eos: warning: the ledger topic {topic} has replication factor {have.replication} on a cluster of "
            f"{brokers} brokers (eos creates it with {replication}); losing a broker can lose the ledger"
        )
        log.warning(message)
        print(message, file=sys.stderr, flush=True)


def _once_visible(admin: Any, topic: str, timeout_s: float = 10.0) -> tuple[dict[str, str], TopicInfo]:
    """The topic's settings and description, asked again for a while if the broker asked does not
    know the topic yet: CreateTopics returns when the controller has committed a topic, and each
    broker learns of it a moment later."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return topic_settings(admin, topic), describe_topics(admin, [topic])[topic]
        except UnknownTopic:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _described(admin: Any, topic: str) -> TopicInfo | None:
    try:
        return describe_topics(admin, [topic])[topic]
    except UnknownTopic:
        return None


def fence(client: dict[str, Any], transactional_ids: Iterable[str], timeout_s: float = 60.0) -> float:
    """init_transactions on every id: bumps its producer epoch (fencing zombies) and aborts any
    transaction it left open. Returns the seconds it took."""
    started = time.monotonic()
    refused = fence_each([(client, txid) for txid in transactional_ids], timeout_s)
    if refused:
        raise refused[0][1]
    return time.monotonic() - started


# Producers at once on the librdkafka path (settings the wire path does not implement): each costs
# three connections and ~4 threads; past 16 the local broker's CPU, not the wait, bounded it.
PRODUCERS_AT_ONCE = 16


def fence_each(work: Iterable[tuple[dict[str, Any], str]], timeout_s: float = 60.0) -> list[tuple[str, Exception]]:
    """fence() for (client settings, transactional id) pairs, all at once: ids of sinks that write as
    different principals. Returns the ids the cluster's authorizer refused to that principal, with the
    error; any other failure is raised.

    The ids of each client go over a few connections, one InitProducerId each
    (eos_connectors.kafka.fencer: 1,024 ids in ~0.4 s on the local broker, against ~15 s with a
    producer per id). A client whose settings that path does not implement, or whose cluster it
    cannot use, is fenced with a librdkafka producer per id, as an id is in the sinks."""
    by_client: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for client, txid in work:
        by_client.setdefault(json.dumps(client, sort_keys=True, default=str), (client, []))[1].append(txid)
    if not by_client:
        return []
    with ThreadPoolExecutor(max_workers=len(by_client)) as pool:
        done = list(pool.map(lambda group: _fence_group(*group, timeout_s), by_client.values()))
    return [refusal for refused in done for refusal in refused]


def _fence_group(client: dict[str, Any], txids: list[str], timeout_s: float) -> list[tuple[str, Exception]]:
    try:
        outcome = fencer.fence(client, txids, timeout_s)
    except fencer.Unsupported as why:
        log.debug("fencing %d ids with librdkafka producers: the wire path does not implement %s", len(txids), why)
    except (OSError, fencer.WireError) as exc:
        log.warning("fencing %d ids over the wire failed (%s); fencing them with librdkafka producers", len(txids), exc)
    else:
        return [(txid, refusal(code, txid)) for txid, code in outcome.refused]
    return _fence_with_producers(client, txids, timeout_s)


def refusal(code: int, txid: str) -> Exception:
    """The error a librdkafka producer raises for an id the authorizer refused (is_refused knows it)."""
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(code, f"transactional id {txid}: authorization failed"))


def _fence_with_producers(client: dict[str, Any], txids: list[str], timeout_s: float) -> list[tuple[str, Exception]]:
    def one(txid: str) -> tuple[str, Exception] | None:
        instance = producer({**client, "transactional.id": txid})
        try:
            instance.init_transactions(timeout_s)
        except Exception as exc:
            if is_refused(exc):
                return txid, exc
            raise
        finally:
            with contextlib.suppress(Exception):  # a refused producer is in a fatal state: close() raises it again
                instance.close(5)
        return None

    with ThreadPoolExecutor(max_workers=min(PRODUCERS_AT_ONCE, len(txids))) as pool:
        return [outcome for outcome in pool.map(one, txids) if outcome is not None]


def wait_until_stable(client: dict[str, Any], topic: str, wait_s: float, admin: Any = None) -> dict[int, int]:
    """End offsets of `topic` once nothing is open on it (the last stable offset reached the high
    watermark). Call after fencing: then nothing of this pipeline is open, and a transaction still
    open is someone else's (bounded wait, then a clear error). `admin`: a client to reuse.
    Returns the last stable offsets, not the high watermark read first: a commit marker is written
    after `commit_transaction` returns, so that first read can end before the marker."""
    admin = admin or admin_client(client)
    partitions = {topic: describe_topics(admin, [topic])[topic].partitions}
    deadline = time.monotonic() + wait_s
    high = end_offsets(admin, partitions, read_committed=False)
    while True:
        stable = end_offsets(admin, partitions, read_committed=True)
        if all(stable[tp] >= high[tp] for tp in high):
            return {p: end for (_, p), end in stable.items()}
        if time.monotonic() > deadline:
            raise EnvironmentProblem(
                f"the ledger topic {topic} has an open transaction that is not this pipeline's and did not finish "
                f"within {wait_s:.0f} s; its last stable offset is stuck at {stable}",
                hint="another writer uses this ledger topic; give each pipeline its own (ledger.topic)",
            )
        time.sleep(0.2)


def scan(
    client: dict[str, Any], topic: str, ends: dict[int, int], strict: bool = True
) -> dict[bytes, tuple[int, bytes]]:
    """The latest committed value of every key below `ends` (partition -> offset), with its
    offset; a key whose latest record is a tombstone (forget) has none. strict: stall for longer
    before giving up (recovery); otherwise report sooner."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    reader = range_consumer(client)
    try:
        for partition, end in ends.items():
            for batch in read_range(reader, topic, partition, 0, end, stall_timeout_s=120 if strict else 30):
                for message in batch:
                    key, value = message.key(), message.value()
                    if key is None:
                        continue
                    if value is None:
                        latest.pop(key, None)
                    else:
                        latest[key] = (message.offset(), value)
    finally:
        reader.close()
    return latest


def entries(latest: dict[bytes, tuple[int, bytes]], pipeline: str, topic: str, strict: bool = True) -> Ledger:
    """The ledger entries of `pipeline` among scanned records."""
    found: Ledger = {}
    prefix = f"{pipeline}/".encode()
    for key, (offset, value) in latest.items():
        if not key.startswith(prefix) or key.split(b"/")[1] == CONTROL.encode():
            continue
        try:
            entry = LedgerEntry.from_json(value)
        except (ValueError, TypeError, KeyError) as exc:
            if not strict:
                continue
            raise CheckpointError(f"ledger topic {topic}: unreadable record at offset {offset}: {exc}") from exc
        found[(entry.sink, entry.slot)] = entry
    return found


def read_ledger(client: dict[str, Any], topic: str, pipeline: str, wait_s: float = 120.0) -> Ledger:
    """The latest committed entry of each (sink, slot) of `pipeline` (call after fencing)."""
    return entries(scan(client, topic, wait_until_stable(client, topic, wait_s)), pipeline, topic)


def forget(client: dict[str, Any], topic: str, pipeline: str, wait_s: float = 120.0) -> int:
    """Tombstones for every key of `pipeline` in `topic` (its ledger entries, of every sink it
    ever had), and for no other pipeline's; how many. Call after fencing: nothing of this pipeline
    is open. A topic that does not exist holds nothing to forget."""
    admin = admin_client(client)
    try:
        ends = wait_until_stable(client, topic, wait_s, admin)
    except UnknownTopic:
        return 0
    prefix = f"{pipeline}/".encode()  # a pipeline name has no "/": it is the key's whole first part
    # Per partition: a tombstone compacts away only the records of its key in its own partition.
    keys = [
        (partition, key)
        for partition, end in ends.items()
        for key in scan(client, topic, {partition: end})
        if key.startswith(prefix)
    ]
    if keys:
        tombstones(client, topic, keys)
    return len(keys)


def tombstones(client: dict[str, Any], topic: str, keys: list[tuple[int, bytes]], timeout_s: float = 60.0) -> None:
    """A tombstone for each (partition, key), durable (acks=all, idempotent) when this returns."""
    failed: list[str] = []

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            failed.append(str(error))

    instance = producer({**client, "enable.idempotence": True, "acks": "all", "linger.ms": 0})
    try:
        for partition, key in keys:
            instance.produce(topic, None, key, partition=partition, on_delivery=delivered)
        left = instance.flush(timeout_s)
    finally:
        with contextlib.suppress(Exception):
            instance.close(5)
    if failed or left:
        raise EnvironmentProblem(
            f"forgetting entries in {topic}: {failed[0] if failed else f'{left} tombstones not delivered'}",
            hint="run eos reset again once Kafka is reachable: it forgets what is left",
        )

"""The two-phase-commit Kafka sink: what one sink slot does in one epoch (runs in a Spark task).

The slot's records arrive as Arrow batches with columns (sink, key, value, headers): every sink
of the pipeline, and the dead-letter queues, flow through the same slots. For each sink with
records in this slot, the slot holds one transactional producer with the stable id
`<prefix>-<sink>-<slot>`, and per epoch:

  pre-commit   begin, produce the records, produce the ledger record (pipeline, sink, slot,
               epoch) into the same transaction, flush
  vote         tell the driver's coordinator "prepared", wait for the decision
  commit       commit every transaction of the slot (or abort them all)

A (sink, slot) that the ledger says already committed this epoch writes nothing (a replay).
In at-least-once mode the slot produces with an idempotent, non-transactional producer and
neither votes nor writes ledger records: the baseline and negative control.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from eos.failpoints import DISARMED, Failpoints
from eos.protocol.coordinator import COMMIT, CoordinatorAddress, VoteClient
from eos_connectors.kafka.clients import is_fatal, is_retriable, kafka_error, producer, requires_abort

SLOT_INPUT_COLUMNS = ("sink", "key", "value", "headers")
REPORT_SCHEMA = "slot int, report string"


class SlotAborted(RuntimeError):
    """The epoch attempt was aborted for this slot; the driver retries the epoch."""


@dataclass(frozen=True)
class SinkTarget:
    """Where the rows tagged `name` go."""

    name: str
    topic: str | None  # None: count only (poison records under on_error: skip)
    client: dict[str, Any]
    transactional_prefix: str  # the id is f"{transactional_prefix}-{slot}"


@dataclass(frozen=True)
class EpochPlan:
    """Everything a slot needs for one attempt of one epoch (pickled into the task)."""

    pipeline: str
    checkpoint_id: str
    epoch: int
    attempt: int
    slots: int
    exactly_once: bool
    targets: dict[str, SinkTarget]
    ledger_topic: str
    skip: frozenset[tuple[str, int]] = frozenset()  # (sink, slot) already committed this epoch
    owners: dict[str, str] = field(default_factory=dict)  # transactional id -> producer token
    coordinator: CoordinatorAddress | None = None
    timeout_s: float = 300.0
    failpoints: Failpoints = DISARMED


# ---------------------------------------------------------------------------------------------
# Producers, cached per Python worker process
# ---------------------------------------------------------------------------------------------


# Batching for the sink's producers (the raw-loop benchmark baseline uses the same): large
# batches, a short linger, lz4.
PRODUCER_BATCHING: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
    "compression.type": "lz4",
}


@dataclass
class CachedProducer:
    producer: Any
    token: str  # identifies this producer instance; the driver remembers the last committer


_producers: dict[str, CachedProducer] = {}


def _new_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _retry(call, what: str, timeout_s: float):
    """Retry a transactional call on retriable errors (tenacity), until timeout_s."""
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

    retrying = retry(
        retry=retry_if_exception(is_retriable),
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.05, max=2),
        reraise=True,
    )
    return retrying(call)()


def transactional_producer(txid: str, target: SinkTarget, expected_token: str | None, timeout_s: float):
    """The cached producer for `txid` if this process still owns the id, else a new one.

    Reusing saves `init_transactions` (~60 ms) per slot and epoch. Ownership is known from the
    driver: it passes the token of the producer that committed this id last. Any other process
    that used the id since would have fenced our instance, so a token mismatch means recreate.
    """
    cached = _producers.get(txid)
    if cached is not None and cached.token == expected_token:
        return cached
    if cached is not None:
        _close(_producers.pop(txid))
    config = {
        # A pre-committed transaction must outlive a slow epoch; the broker aborts it after this.
        "transaction.timeout.ms": int(max(60.0, 2 * timeout_s) * 1000),
        **target.client,
        "transactional.id": txid,
        **{key: target.client.get(key, default) for key, default in PRODUCER_BATCHING.items()},
        # Small requests (InitProducerId, AddPartitions, EndTxn) must not wait on Nagle: measured
        # 55 -> 15 ms for a fresh init_transactions on loopback.
        "socket.nagle.disable": target.client.get("socket.nagle.disable", True),
    }
    instance = producer(config)

    def connect_and_init() -> None:
        # A metadata request first opens the broker connection; without it librdkafka's
        # coordinator lookup sometimes waits for its next retry tick: measured (bench/, section
        # "a fresh sink producer") p90 504 -> 56 ms, max 507 -> 66 ms for init_transactions.
        instance.list_topics(target.topic, timeout=timeout_s)
        instance.init_transactions(timeout_s)

    _retry(connect_and_init, f"init_transactions({txid})", timeout_s)
    cached = CachedProducer(instance, _new_token())
    _producers[txid] = cached
    return cached


_plain_producers: dict[str, Any] = {}


def idempotent_producer(target: SinkTarget):
    key = json.dumps(target.client, sort_keys=True)
    if key not in _plain_producers:
        _plain_producers[key] = producer({**target.client, "enable.idempotence": True, **PRODUCER_BATCHING})
    return _plain_producers[key]


def _close(cached: CachedProducer) -> None:
    with contextlib.suppress(Exception):
        cached.producer.close(1)


def forget_producer(txid: str) -> None:
    if txid in _producers:
        _close(_producers.pop(txid))


# ---------------------------------------------------------------------------------------------
# Producing Arrow rows
# ---------------------------------------------------------------------------------------------


def produce_pairs(instance: Any, topic: str, pairs: Iterable[tuple[bytes | None, bytes | None]]) -> None:
    """Queue (key, value) pairs for `topic` with produce_batch (~1.5x faster than one produce()
    a record, but it carries no headers), waiting out a full queue."""
    pending = [{"key": k, "value": v} for k, v in pairs]
    while pending:
        with contextlib.suppress(BufferError):  # failed messages are marked with _error
            instance.produce_batch(topic, pending)
        failed = [m for m in pending if "_error" in m]
        for message in failed:
            error = message.pop("_error")
            if "QUEUE_FULL" not in str(error) and "Queue full" not in str(error):
                raise SlotAborted(f"producing to {topic} failed: {error}")
        pending = failed
        if pending:
            instance.poll(0.05)
    instance.poll(0)


def produce_rows(instance: Any, topic: str, batch: Any) -> int:
    """Queue every row of an Arrow batch (key, value, headers) for `topic`."""
    import pyarrow.compute as pc

    n = batch.num_rows
    if n == 0:
        return 0
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = batch.column("headers")
    has_headers = headers.null_count < n and pc.sum(pc.list_value_length(headers)).as_py()
    if not has_headers:
        produce_pairs(instance, topic, zip(keys, values, strict=True))
        return n
    produce = instance.produce
    for key, value, header in zip(keys, values, headers.to_pylist(), strict=True):
        header_pairs = [(h["key"], h["value"]) for h in header] if header else None
        while True:
            try:
                produce(topic, value, key, headers=header_pairs)
                break
            except BufferError:
                instance.poll(0.05)
    instance.poll(0)
    return n


def _flush(instance: Any, what: str, timeout_s: float) -> None:
    remaining = instance.flush(timeout_s)
    if remaining:
        raise SlotAborted(f"{what}: {remaining} records still undelivered after {timeout_s:.0f} s")


def ledger_record(plan: EpochPlan, sink: str, slot: int, records: int, token: str) -> tuple[str, str]:
    key = f"{plan.pipeline}/{sink}/{slot}"
    value = {
        "pipeline": plan.pipeline, "sink": sink, "slot": slot, "epoch": plan.epoch, "attempt": plan.attempt,
        "checkpoint": plan.checkpoint_id, "records": records, "producer": token, "written_at": time.time(),
    }  # fmt: skip
    return key, json.dumps(value, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# One slot, one epoch
# ---------------------------------------------------------------------------------------------


@dataclass
class SinkWrite:
    target: SinkTarget
    txid: str
    cached: CachedProducer | None = None
    records: int = 0


def _split_by_sink(batch: Any) -> Iterator[tuple[str, Any]]:
    import pyarrow.compute as pc

    sinks = batch.column("sink")
    names = pc.unique(sinks).to_pylist()
    if len(names) == 1:
        yield names[0], batch
        return
    for name in names:
        yield name, batch.filter(pc.equal(sinks, name))


def write_slot(plan: EpochPlan, slot: int, batches: Iterator[Any]) -> dict[str, Any]:
    """Run the slot's part of the epoch; returns its report (counts, timings, producer tokens)."""
    fp = plan.failpoints
    started = time.perf_counter()
    report: dict[str, Any] = {"slot": slot, "pid": os.getpid(), "host": socket.gethostname(),
                              "records": {}, "replay_skipped": {}, "counted_only": {}, "tokens": {}}  # fmt: skip
    writes: dict[str, SinkWrite] = {}
    voter = None
    if plan.exactly_once and plan.coordinator is not None:
        voter = VoteClient(plan.coordinator, plan.epoch, plan.attempt, slot, plan.timeout_s)
    try:
        produced_batches = 0
        for batch in batches:
            for name, rows in _split_by_sink(batch):
                target = plan.targets[name]
                if target.topic is None:
                    report["counted_only"][name] = report["counted_only"].get(name, 0) + rows.num_rows
                    continue
                if (name, slot) in plan.skip:
                    report["replay_skipped"][name] = report["replay_skipped"].get(name, 0) + rows.num_rows
                    continue
                write = writes.get(name)
                if write is None:
                    write = writes[name] = SinkWrite(target, f"{target.transactional_prefix}-{slot}")
                    if plan.exactly_once:
                        acquire_started = time.perf_counter()
                        write.cached = transactional_producer(
                            write.txid, target, plan.owners.get(write.txid), plan.timeout_s
                        )
                        report["init_s"] = report.get("init_s", 0.0) + time.perf_counter() - acquire_started
                        report["reused"] = write.cached.token == plan.owners.get(write.txid)
                        write.cached.producer.begin_transaction()
                    else:
                        write.cached = CachedProducer(idempotent_producer(target), "")
                write.records += produce_rows(write.cached.producer, target.topic, rows)
                produced_batches += 1
                if produced_batches == 1:
                    fp.hit("sink.mid_produce", plan.epoch, slot, plan.attempt)
        report["produce_s"] = time.perf_counter() - started

        flush_started = time.perf_counter()
        for name, write in writes.items():
            assert write.cached is not None
            if plan.exactly_once:
                key, value = ledger_record(plan, name, slot, write.records, write.cached.token)
                write.cached.producer.produce(plan.ledger_topic, value.encode(), key.encode())
            _flush(write.cached.producer, f"sink {name} slot {slot}", plan.timeout_s)
            report["records"][name] = write.records
        report["flush_s"] = time.perf_counter() - flush_started
        if not plan.exactly_once:
            # No vote and no commit: the records are already visible. The same points fire here so
            # the fault matrix can crash at-least-once runs where exactly-once runs are crashed.
            for point in ("sink.after_precommit", "sink.after_agreement", "sink.between_commits"):
                fp.hit(point, plan.epoch, slot, plan.attempt)
            return report

        fp.hit("sink.after_precommit", plan.epoch, slot, plan.attempt)
        vote_started = time.perf_counter()
        assert voter is not None
        decision, reason = voter.vote_prepared({"records": report["records"]})
        report["vote_s"] = time.perf_counter() - vote_started
        if decision != COMMIT:
            raise SlotAborted(f"epoch {plan.epoch} attempt {plan.attempt} aborted: {reason}")

        fp.hit("sink.after_agreement", plan.epoch, slot, plan.attempt)
        commit_started = time.perf_counter()
        for write in writes.values():
            assert write.cached is not None
            _commit(write, plan.timeout_s)
            report["tokens"][write.txid] = write.cached.token
        report["commit_s"] = time.perf_counter() - commit_started
        fp.hit("sink.between_commits", plan.epoch, slot, plan.attempt)
        voter.report_committed()
        return report
    except BaseException as exc:
        if voter is not None:
            voter.vote_failed(f"{type(exc).__name__}: {exc}")
        for write in writes.values():
            _abort_quietly(write)
        raise
    finally:
        if voter is not None:
            voter.close()


def _commit(write: SinkWrite, timeout_s: float) -> None:
    assert write.cached is not None
    instance = write.cached.producer
    try:
        _retry(lambda: instance.commit_transaction(timeout_s), f"commit {write.txid}", timeout_s)
    except Exception as exc:
        # Visible in the executor's log: a zombie that wakes up after a newer attempt fenced its
        # transactional id ends here, and nothing it wrote becomes visible.
        print(f"eos: commit of {write.txid} refused: {kafka_error(exc) or exc}", file=sys.stderr, flush=True)
        if requires_abort(exc):
            _abort_quietly(write)
            raise SlotAborted(f"commit of {write.txid} needs an abort: {kafka_error(exc)}") from exc
        forget_producer(write.txid)
        raise


def _abort_quietly(write: SinkWrite) -> None:
    """Best effort: an abandoned transaction is also aborted by the next fencing."""
    if write.cached is None or not write.txid:
        return
    try:
        write.cached.producer.abort_transaction(10)
    except Exception as exc:
        if is_fatal(exc) or not is_retriable(exc):
            forget_producer(write.txid)


def slot_task(plan: EpochPlan):
    """The function for `mapInArrow(..., barrier=...)`: one task = one slot."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        slot = TaskContext.get().partitionId()
        report = write_slot(plan, slot, batches)
        yield pa.RecordBatch.from_arrays(
            [pa.array([slot], pa.int32()), pa.array([json.dumps(report)], pa.string())], names=["slot", "report"]
        )

    return run

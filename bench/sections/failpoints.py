"""Failpoints, disarmed, cost nothing measurable (issue 4).

The slot path, eos.protocol.slot.write_slot with the Kafka sink's writer, writes N records through
a real transactional producer (lease on a real coordinator, begin, produce, ledger record, flush,
the `prepared` vote, the commit thread's commit once the decision is released), once with eos's
disarmed `Failpoints.hit` and once with `hit` replaced by a function that does nothing (the
failpoints "compiled out"). Rounds alternate the order; a
third run per round repeats the disarmed variant, so the A/A ratio shows how large the noise is.
Plus the cost of one disarmed hit() in nanoseconds, and how many a slot makes per epoch.
"""

from __future__ import annotations

import random
import time
import timeit
from typing import Any

from bench.context import Bench
from bench.inputs import delete_topics
from bench.stats import paired_ratios, summarize

HITS_PER_SLOT_EPOCH = 4  # mid_produce (first batch), after_precommit, after_agreement, between_commits
HITS_PER_DRIVER_EPOCH = 2  # epoch.after_offsets_logged, epoch.after_commit


def _noop(self: Any, name: str, epoch: int | None = None, slot: int | None = None, attempt: int | None = None) -> None:
    return None


def _batches(bench: Bench, records: int) -> list[Any]:
    """The rows one slot gets in a pipeline: the sink's tag, and its struct of key, value (Avro
    bytes, already encoded: the writer has no codec here), headers."""
    import pyarrow as pa

    from bench.inputs import encode_event, live_event
    from eos.protocol.plan import SINK_TAG, sink_column
    from eos_ops.demo import EVENT_SCHEMA, avro_schema

    headers_type = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    schema, rng = avro_schema(EVENT_SCHEMA), random.Random(3)
    events = [live_event(i, 3, 1_767_225_600_000 + i, rng) for i in range(records)]
    keys = [e["event_id"].encode() for e in events]
    values = [encode_event(e, schema) for e in events]
    batches = []
    for start in range(0, records, 10_000):  # Spark hands a slot Arrow batches of up to 10,000 rows
        end = min(records, start + 10_000)
        rows = pa.StructArray.from_arrays(
            [pa.array(keys[start:end], pa.binary()), pa.array(values[start:end], pa.binary()),
             pa.array([[]] * (end - start), headers_type)],
            names=["key", "value", "headers"],
        )  # fmt: skip
        batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array([0] * (end - start), pa.int32()), rows], names=[SINK_TAG, sink_column(0)]
            )
        )
    return batches


def run(bench: Bench) -> dict[str, Any]:
    from eos.failpoints import DISARMED, Failpoints
    from eos.protocol.coordinator import Coordinator
    from eos.protocol.plan import EpochPlan, SinkPlan
    from eos.protocol.sink import PipelineInfo
    from eos.protocol.slot import write_slot
    from eos_connectors.kafka.clients import admin_client, create_topic
    from eos_connectors.kafka.ledger import ensure_ledger_topic
    from eos_connectors.kafka.sink import KafkaWriterFactory

    plan = bench.plan
    client = {"bootstrap.servers": bench.bootstrap}
    topic, ledger = f"bench-fp-{time.monotonic_ns()}", f"bench-fp-ledger-{time.monotonic_ns()}"
    create_topic(admin_client(client), topic, 4)
    ensure_ledger_topic(client, ledger)
    factory = KafkaWriterFactory(
        sink="out", topic=topic, client=client, prefix=f"{topic}-tx", ledger_topic=ledger, exactly_once=True,
        timeout_s=60.0, codecs={},
    )  # fmt: skip
    info = PipelineInfo("bench-fp", "bench", exactly_once=True, epoch_timeout_s=60.0, ledger=ledger)
    batches = _batches(bench, plan.failpoint_records)
    coordinator = Coordinator(bind_host="127.0.0.1", advertise_host="127.0.0.1")
    coordinator.set_pools({"out": 1})
    epoch = 0

    def slot_epoch() -> float:
        """One slot's epoch, as the driver and the task see it: pre-commit, vote, decision, commit."""
        nonlocal epoch
        epoch += 1
        epoch_plan = EpochPlan(
            pipeline=info, epoch=epoch, attempt=1, run="bench", offsets="-", config="-",
            sinks=(SinkPlan("out", 0, factory, True),), skip=frozenset(), coordinator=coordinator.address,
            timeout_s=60.0,
        )  # fmt: skip
        coordinator.open_attempt(epoch, 1, 60.0)
        started = time.perf_counter()
        report = write_slot(epoch_plan, 0, 0, iter(batches))
        keys = [(p.sink, p.handle) for p in report.prepared()]
        coordinator.release(epoch, 1, keys)
        problems = coordinator.wait_committed(epoch, 1, keys, 60.0)
        elapsed = time.perf_counter() - started
        coordinator.close_attempt(epoch, 1, "finished")
        if problems:
            raise RuntimeError(f"the slot's commit failed: {problems}")
        return elapsed

    original = Failpoints.hit
    timings: dict[str, list[float]] = {"disarmed": [], "compiled_out": [], "disarmed_again": []}
    try:
        slot_epoch()  # warm-up: the producer's init_transactions, connections
        for round_no in range(plan.failpoint_rounds):
            order = ("disarmed", "compiled_out") if round_no % 2 == 0 else ("compiled_out", "disarmed")
            for variant in (*order, "disarmed_again"):
                Failpoints.hit = _noop if variant == "compiled_out" else original  # type: ignore[method-assign]
                timings[variant].append(slot_epoch())
            bench.say(
                f"failpoints: round {round_no + 1}/{plan.failpoint_rounds}: disarmed "
                f"{timings['disarmed'][-1] * 1e3:.0f} ms, compiled out {timings['compiled_out'][-1] * 1e3:.0f} ms "
                f"({plan.failpoint_records:,} records)"
            )
    finally:
        Failpoints.hit = original  # type: ignore[method-assign]
        coordinator.close()
        delete_topics(bench.bootstrap, [topic, ledger])
    calls = 2_000_000
    hit_ns = min(timeit.repeat(lambda: DISARMED.hit("sink.mid_produce", 1, 0, 1), number=calls, repeat=5)) / calls * 1e9
    noop_ns = (
        min(timeit.repeat(lambda: _noop(DISARMED, "sink.mid_produce", 1, 0, 1), number=calls, repeat=5)) / calls * 1e9
    )
    return {
        "records": plan.failpoint_records,
        "rounds": plan.failpoint_rounds,
        "timings_s": timings,
        "ratio": summarize(paired_ratios(timings["disarmed"], timings["compiled_out"])).to_dict(),
        "noise_ratio": summarize(paired_ratios(timings["disarmed_again"], timings["disarmed"])).to_dict(),
        "hit_ns": round(hit_ns, 1),
        "noop_call_ns": round(noop_ns, 1),
        "hits_per_slot_epoch": HITS_PER_SLOT_EPOCH,
        "hits_per_driver_epoch": HITS_PER_DRIVER_EPOCH,
    }

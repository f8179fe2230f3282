"""What Kafka transactions cost the broker: the CPU an exactly-once epoch adds over at-least-once.

An exactly-once epoch of the stateless bench pipeline has three transactions: one per slot (its
share of the epoch's records over the output topic's partitions, plus its ledger record on the
ledger topic's partition) and the driver's decision (one record in the control log). An
at-least-once epoch produces the same records idempotently, without transactions. This produces
those shapes alone with eos's producer settings against the bench's broker and reads the broker's
CPU from /proc around each block:
- `idempotent`: a slot's records, flushed (at-least-once's slot);
- `slot transaction`: the same records in a transaction with one more record on another topic;
- `decision transaction`: one record in a transaction.
Each block repeats its shape, then waits for the broker to settle (transaction markers are written
after commit_transaction returns); an idle block of the same wait is subtracted. Blocks alternate
their order from round to round. The broker's JIT is still compiling its produce path long after
it starts (a fresh broker's idempotent blocks fell from 960 to 270 ms over five rounds), so
rounds are discarded first, and the epoch's extra is the median of each round's own difference
(its blocks ran side by side), not a difference of medians.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench
from bench.inputs import delete_topics
from bench.procs import cpu_seconds
from bench.stats import summarize
from eos_connectors.kafka.clients import admin_client, connect, create_topic, producer
from eos_connectors.kafka.sink import PRODUCER_BATCHING

SHAPES = ("idle", "idempotent", "slot transaction", "decision transaction")
SETTLE_S = 0.5
VALUE = b"x" * 40  # the bench's Avro values are 40.5 bytes on average


def _block(client: Any, shape: str, units: int, records: int, out: str, ledger: str) -> float:
    """Produce `units` of `shape`; the client's seconds (the broker settles after)."""
    transactional = shape != "idempotent"  # with one record on the ledger (slot) or alone (decision)
    started = time.perf_counter()
    for _ in range(units if shape != "idle" else 0):
        if transactional:
            client.begin_transaction()
        for i in range(records if shape != "decision transaction" else 0):
            client.produce(out, VALUE, key=str(i).encode())
            if i % 10_000 == 0:
                client.poll(0)
        if transactional:
            client.produce(ledger, b'{"kind": "entry"}')
            client.commit_transaction(30)
        else:
            client.flush(30)
    return time.perf_counter() - started


def run(bench: Bench) -> dict[str, Any]:
    if bench.broker_pid is None:
        raise RuntimeError("the broker's CPU cannot be read: its process is not known")
    plan = bench.plan
    warmup, rounds, units = (1, 2, 5) if plan.quick else (4, 7, 20)
    slots = 2  # the bench pipelines' `slots`
    records = plan.epoch_records // slots
    prefix = f"bench-txn-{time.monotonic_ns()}"
    out, ledger = f"{prefix}-out", f"{prefix}-ledger"
    admin = admin_client({"bootstrap.servers": bench.bootstrap})
    create_topic(admin, out, plan.partitions)
    create_topic(admin, ledger, 1)
    settings = {"bootstrap.servers": bench.bootstrap, **PRODUCER_BATCHING}
    clients = {
        "idempotent": producer({**settings, "enable.idempotence": True}),
        "slot transaction": producer({**settings, "transactional.id": f"{prefix}-slot"}),
        "decision transaction": producer({**settings, "transactional.id": f"{prefix}-decision"}),
    }
    for shape, client in clients.items():
        connect(client, out, 10)
        if shape != "idempotent":
            client.init_transactions(30)
    cpu_ms: dict[str, list[float]] = {s: [] for s in SHAPES}
    client_ms: dict[str, list[float]] = {s: [] for s in SHAPES}
    try:
        for r in range(warmup + rounds):
            if r == warmup:  # the warm-up rounds are discarded
                cpu_ms, client_ms = {s: [] for s in SHAPES}, {s: [] for s in SHAPES}
            for shape in SHAPES if r % 2 == 0 else SHAPES[::-1]:
                time.sleep(SETTLE_S)
                before = cpu_seconds(bench.broker_pid)
                took = _block(clients.get(shape), shape, units, records, out, ledger)
                time.sleep(SETTLE_S)
                cpu_ms[shape].append((cpu_seconds(bench.broker_pid) - before) * 1e3)
                client_ms[shape].append(took * 1e3 / units)
    finally:
        for client in clients.values():
            client.flush(10)
    delete_topics(bench.bootstrap, [out, ledger])
    idle = summarize(cpu_ms["idle"]).median
    # Per round, less that round's idle block.
    per_unit = {
        s: [(v - i) / units for v, i in zip(cpu_ms[s], cpu_ms["idle"], strict=True)] for s in SHAPES if s != "idle"
    }
    summary = {
        s: {
            "broker_cpu_ms": round(summarize(v).median, 2),
            "low": round(summarize(v).low, 2),
            "high": round(summarize(v).high, 2),
            "client_ms": round(summarize(client_ms[s]).median, 2),
        }
        for s, v in per_unit.items()
    }
    extras = [
        slots * (slot - idem) + decision
        for slot, idem, decision in zip(
            per_unit["slot transaction"], per_unit["idempotent"], per_unit["decision transaction"], strict=True
        )
    ]
    extra = summarize(extras).median
    bench.say(
        "transactions: broker CPU per unit "
        + ", ".join(f"{s} {v['broker_cpu_ms']:.1f} ms" for s, v in summary.items())
        + f"; an exactly-once epoch adds ~{extra:.0f} ms"
    )
    return {
        "rounds": rounds,
        "warmup_rounds": warmup,
        "units": units,
        "records_per_slot": records,
        "slots": slots,
        "partitions": plan.partitions,
        "idle_ms": round(idle, 2),
        "broker_cpu_ms": cpu_ms,
        "summary": summary,
        "epoch_extra_ms": round(extra, 1),
        "epoch_extra_low_ms": round(min(extras), 1),
        "epoch_extra_high_ms": round(max(extras), 1),
    }

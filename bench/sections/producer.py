"""The sink's producer start-up: what `init_transactions` on a fresh transactional producer costs.

A slot whose task lands on another Python worker than last epoch builds a new producer
(`KafkaWriter._lease` in eos_connectors/kafka/sink.py). This measures that step alone, against
the local broker: as eos's `producer()` builds it (every broker connected at creation), with one
metadata request first, and with librdkafka's default sparse connections (what eos did before:
the transaction coordinator's broker is connected only when init_transactions asks, and the
producer-id request often waits for librdkafka's 500 ms retry timer).
Alternating, each on the same two transactional ids, so every init also fences the previous
instance, as it does in a pipeline.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench
from bench.stats import percentile, summarize
from eos_connectors.kafka.clients import producer

VARIANTS = ("as eos does it", "metadata request first", "sparse connections (librdkafka's default)")


def _init_once(bootstrap: str, txid: str, warm: bool, sparse: bool = False) -> float:
    config = {"bootstrap.servers": bootstrap, "transactional.id": txid, "socket.nagle.disable": True, "linger.ms": 5}
    if sparse:
        config["enable.sparse.connections"] = True
    instance = producer(config)
    started = time.perf_counter()
    if warm:
        instance.list_topics(timeout=10)
    instance.init_transactions(30)
    elapsed = time.perf_counter() - started
    instance.close(5)
    return elapsed


def run(bench: Bench) -> dict[str, Any]:
    rounds = 10 if bench.plan.quick else 40
    prefix = f"bench-init-{time.monotonic_ns()}"
    timings: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            warm, sparse = variant == VARIANTS[1], variant == VARIANTS[2]
            timings[variant].append(_init_once(bench.bootstrap, f"{prefix}-{i % 2}", warm, sparse))
    for variant, values in timings.items():
        bench.say(
            f"init_transactions {variant}: median {summarize(values).median * 1e3:.0f} ms, "
            f"p90 {percentile(values, 90) * 1e3:.0f} ms"
        )
    return {
        "rounds": rounds,
        "timings_s": timings,
        "summary": {
            v: {
                "median_ms": round(summarize(t).median * 1e3, 1),
                "p90_ms": round(percentile(t, 90) * 1e3, 1),
                "max_ms": round(max(t) * 1e3, 1),
                "over_400ms": sum(x > 0.4 for x in t),
            }
            for v, t in timings.items()
        },
    }

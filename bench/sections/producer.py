"""The sink's producer start-up: what `init_transactions` on a fresh transactional producer costs.

A slot whose task lands on another Python worker than last epoch builds a new producer
(`KafkaWriter._lease` in eos_connectors/kafka/sink.py). This measures that step alone, against
the local broker, in four variants: as eos does it (`producer()` connects every broker at
creation, then `connect()`: two metadata requests, so that a broker learned from metadata is up
before the producer-id request), with one metadata request first (eos until 2026-11-24: the
request is often answered over the bootstrap connection, which librdkafka then replaces, and a
producer-id request in that gap waits for its 500 ms retry timer), with none, and with
librdkafka's default sparse connections (eos before 2026-11-23). Alternating, each on the same
two transactional ids, so every init also fences the previous instance, as it does in a pipeline.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench
from bench.inputs import delete_topics
from bench.stats import percentile, summarize
from eos_connectors.kafka.clients import admin_client, connect, create_topic, producer

VARIANTS = (
    "as eos does it",
    "one metadata request first",
    "no metadata request",
    "sparse connections (librdkafka's default)",
)


def _init_once(bootstrap: str, topic: str, txid: str, variant: str) -> float:
    config = {"bootstrap.servers": bootstrap, "transactional.id": txid, "socket.nagle.disable": True, "linger.ms": 5}
    if variant == VARIANTS[3]:
        config["enable.sparse.connections"] = True
    instance = producer(config)
    started = time.perf_counter()
    if variant == VARIANTS[0]:
        connect(instance, topic, 10)
    elif variant == VARIANTS[1]:
        instance.list_topics(topic, timeout=10)
    instance.init_transactions(30)
    elapsed = time.perf_counter() - started
    instance.close(5)
    return elapsed


def run(bench: Bench) -> dict[str, Any]:
    rounds = 10 if bench.plan.quick else 40
    prefix = f"bench-init-{time.monotonic_ns()}"
    topic = f"{prefix}-out"  # what the metadata requests ask about, as a slot asks about its sink's topic
    create_topic(admin_client({"bootstrap.servers": bench.bootstrap}), topic, 4)
    _init_once(bench.bootstrap, topic, f"{prefix}-warm", VARIANTS[2])  # discarded: the broker's first init is slow
    timings: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            timings[variant].append(_init_once(bench.bootstrap, topic, f"{prefix}-{i % 2}", variant))
    delete_topics(bench.bootstrap, [topic])
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

"""1. Throughput: both pipelines in every configuration, on the same input, in paired rounds.

Each round runs every configuration once, in an order that changes from round to round (so drift
in the machine's load does not always favour the same one); ratios are taken within a round and the
median is over rounds. Right before each pipeline's rounds, a warm-up run of eos exactly-once and
of Spark's built-in connector on this section's own input is discarded (Python workers start, the
JVM compiles that pipeline's code). A warm-up on a small input was not enough: the first run on
the full input was still 20-30% slower than the next ones, whichever configuration it was
(measured: the built-in connector 50,794 rec/s first, then 65,465; eos 46,928, 51,200, 59,332),
and round 1 always starts with eos exactly-once, so its paired ratio came out low in every run.
Warming both pipelines first left the stateful warm-ups between the stateless warm-up and its
round 1, which was still eos's slowest stateless run (51,969 against 62,959-66,925 rec/s).

A full run has ten rounds, in the orders of bench.stats.balanced_orders: each configuration runs
twice in every position, and twice right after each other configuration. Position matters: the
machine still speeds up for several rounds after the warm-up (a six-round run, 2026-11-24: Spark's
built-in connector took 8.4, 6.9, 7.1, 6.2, 6.2 and 6.4 s stateless, eos at-least-once 7.0, 7.1,
6.1, 6.2, 6.2 and 5.8 s), and with three rounds a pair's two configurations sat at unequal
positions in most rounds (eos exactly-once ran 1st, 5th and 4th, at-least-once 2nd, 1st and 5th).
So does the predecessor: the runs share the JVM and the broker, and each leaves work behind for the
next (garbage to collect, transaction markers to write, the broker's log cleaner). Five rotated
rounds balanced positions only: at-least-once always ran right after exactly-once.

Before each run a host check (bench.env.host_check_ms) times a fixed loop: this host changes speed
in phases, and the check says whether a run started in a slow one.
"""

from __future__ import annotations

from typing import Any

from bench.context import Bench
from bench.env import host_check_ms
from bench.perftools import consumer_perf, producer_perf
from bench.runs import CONFIGS, brief, measure, warm_up
from bench.stats import balanced_orders, summarize

PIPELINES = ("stateless", "stateful")


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.events, plan.partitions)
    result: dict[str, Any] = {"input": source.__dict__, "epoch_records": plan.epoch_records, "pipelines": {}}
    for pipeline in PIPELINES:
        warm_up(bench, pipelines=(pipeline,), on=source)  # right before its rounds
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        rounds = plan.throughput_rounds(len(CONFIGS))
        orders = balanced_orders(CONFIGS)
        result["orders"] = [list(order) for order in orders[:rounds]]
        for round_no in range(rounds):
            for config in orders[round_no % len(orders)]:
                bench.say(f"{pipeline}: round {round_no + 1}/{rounds}: {config} ...")
                host_ms = host_check_ms(3)
                row = measure(bench, pipeline, config, source, plan.epoch_records)
                row["round"], row["host_ms"] = round_no, host_ms
                runs[config].append(row)
                bench.say(f"{pipeline}: round {round_no + 1}/{rounds}: {config}: {brief(row)}")
        result["pipelines"][pipeline] = {"runs": runs}
    result["perf"] = perf_tools(bench, source.value_bytes_mean)
    return result


def perf_tools(bench: Bench, record_size: float) -> dict[str, Any]:
    plan = bench.plan
    producer, consumer = [], []
    for round_no in range(plan.rounds):
        topic = f"bench-perf-{round_no}"
        bench.say(f"perf tools: round {round_no + 1}/{plan.rounds}: ProducerPerformance {plan.perf_records:,} records")
        producer.append(producer_perf(bench.bootstrap, topic, plan.partitions, plan.perf_records, round(record_size)))
        bench.say(f"perf tools: round {round_no + 1}/{plan.rounds}: ConsumerPerformance {plan.perf_records:,} records")
        consumer.append(consumer_perf(bench.bootstrap, topic, plan.perf_records))
        bench.say(f"perf tools: producer {producer[-1]:,.0f} rec/s, consumer {consumer[-1]:,.0f} rec/s")
    return {
        "records": plan.perf_records,
        "record_size": round(record_size),
        "producer_rps": producer,
        "consumer_rps": consumer,
        "producer": summarize(producer).to_dict(),
        "consumer": summarize(consumer).to_dict(),
        "ceiling_rps": [min(p, c) for p, c in zip(producer, consumer, strict=True)],
    }

"""1. Throughput: both pipelines in every configuration, on the same input, in paired rounds.

Each round runs every configuration once, in an order rotated from round to round (so drift in
the machine's load does not always favour the same one); ratios are taken within a round and the
median is over rounds. Right before each pipeline's rounds, a warm-up run of eos exactly-once and
of Spark's built-in connector on this section's own input is discarded (Python workers start, the
JVM compiles that pipeline's code). A warm-up on a small input was not enough: the first run on
the full input was still 20-30% slower than the next ones, whichever configuration it was
(measured: the built-in connector 50,794 rec/s first, then 65,465; eos 46,928, 51,200, 59,332),
and round 1 always starts with eos exactly-once, so its paired ratio came out low in every run.
Warming both pipelines first left the stateful warm-ups between the stateless warm-up and its
round 1, which was still eos's slowest stateless run (51,969 against 62,959-66,925 rec/s).
"""

from __future__ import annotations

from typing import Any

from bench.context import Bench
from bench.perftools import consumer_perf, producer_perf
from bench.runs import CONFIGS, brief, measure
from bench.stats import summarize

PIPELINES = ("stateless", "stateful")


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.events, plan.partitions)
    result: dict[str, Any] = {"input": source.__dict__, "epoch_records": plan.epoch_records, "pipelines": {}}
    for pipeline in PIPELINES:
        bench.warm_up(pipelines=(pipeline,), on=source)  # right before its rounds
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for round_no in range(plan.rounds):
            order = CONFIGS[round_no % len(CONFIGS) :] + CONFIGS[: round_no % len(CONFIGS)]
            for config in order:
                bench.say(f"{pipeline}: round {round_no + 1}/{plan.rounds}: {config} ...")
                row = measure(bench, pipeline, config, source, plan.epoch_records)
                row["round"] = round_no
                runs[config].append(row)
                bench.say(f"{pipeline}: round {round_no + 1}/{plan.rounds}: {config}: {brief(row)}")
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

"""10. Skew: one hot input partition at 10× the rate of each other one.

- Throughput: the stateless pipeline, exactly-once, available-now, on two inputs of the same
  events over 4 partitions: uniform (by key hash) and skewed (partition 0 holds `hot` times the
  records of each other partition). Paired rounds; target: skewed ≥ 0.9× uniform.
- Latency: the latency probe at the 1 s trigger, exactly-once, writing to explicit partitions: a
  uniform run (every partition at the same rate r) and a skewed run (partition 0 at `hot`·r, the
  others still at r). Target: the p99 produce-to-visible latency of the cold partitions' records
  in the skewed run ≤ 1.2× the p99 of the uniform run.
"""

from __future__ import annotations

from typing import Any

from bench.context import Bench
from bench.runs import EO, brief, measure, warm_up
from bench.sections.latency import one_run


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    hot = plan.skew_hot
    uniform = bench.input(plan.events, plan.partitions)
    skewed = bench.input(plan.events, plan.partitions, hot=hot)
    # On the full-size input, as the throughput section does: after the small warm-up the first
    # full-size rounds were the slowest (2026-11-27, 21:00: uniform 52,837, 77,413 and 89,047 rec/s
    # in rounds 1-3, skewed 56,649, 49,342 and 95,666; the paired ratios 1.07, 0.64 and 1.07).
    warm_up(bench, on=uniform)
    throughput: dict[str, list[dict[str, Any]]] = {"uniform": [], "skewed": []}
    for round_no in range(plan.rounds):
        for label in ("uniform", "skewed") if round_no % 2 == 0 else ("skewed", "uniform"):
            source = uniform if label == "uniform" else skewed
            bench.say(f"skew: round {round_no + 1}/{plan.rounds}: throughput, {label} input ...")
            row = measure(bench, "stateless", EO, source, plan.epoch_records)
            row["round"] = round_no
            throughput[label].append(row)
            bench.say(f"skew: {label}: {brief(row)}")
    per_partition = plan.latency_rate // plan.partitions
    latency: dict[str, list[dict[str, Any]]] = {"uniform": [], "skewed": []}
    for run_no in range(plan.skew_latency_runs):
        for label in ("uniform", "skewed") if run_no % 2 == 0 else ("skewed", "uniform"):
            factor = 1 if label == "uniform" else hot
            rate = per_partition * (factor + plan.partitions - 1)
            bench.say(f"skew: latency run {run_no + 1}/{plan.skew_latency_runs}, {label} ({rate} rec/s) ...")
            row = one_run(bench, plan.skew_trigger, EO, rate=rate, hot=factor)
            row["run"] = run_no
            latency[label].append(row)
            bench.say(
                f"skew: {label}: p99 {row.get('p99_s', float('nan')):.2f}s, cold partitions p99 "
                f"{row.get('cold_p99_s', float('nan')):.2f}s, hot p99 {row.get('hot_p99_s', float('nan')):.2f}s"
            )
    return {
        "hot": hot,
        "trigger": plan.skew_trigger,
        "rate_per_partition": per_partition,
        "inputs": {"uniform": uniform.__dict__, "skewed": skewed.__dict__},
        "throughput": throughput,
        "latency": latency,
    }

"""5. Scaling: throughput against source partitions and against epoch size.

- Partitions (1, 4, 16): the same number of events on topics of each partition count, eos
  exactly-once, the throughput rows' epoch size. Baseline: the first partition count.
- Epoch size: the 4-partition input with max_records_per_epoch of each size, eos exactly-once
  and at-least-once (the exactly-once/at-least-once ratio shows how the per-epoch protocol cost
  amortizes). Baseline: the smallest epoch size.
The cost per record (epoch time / records) and a line fit of epoch time against records per
epoch (fixed cost per epoch + cost per record) answer "does the cost per record stay flat".
"""

from __future__ import annotations

from typing import Any

from bench.context import Bench
from bench.runs import ALO, EO, brief, measure


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    partitions_rows: list[dict[str, Any]] = []
    for partitions in plan.scaling_partitions:
        source = bench.input(plan.scaling_events, partitions)
        for run_no in range(plan.scaling_runs):
            bench.say(f"partitions {partitions}: run {run_no + 1}/{plan.scaling_runs}: {EO} ...")
            row = measure(bench, "stateless", EO, source, plan.epoch_records)
            row["run"] = run_no
            partitions_rows.append(row)
            bench.say(f"partitions {partitions}: {brief(row)}")
    size_rows: list[dict[str, Any]] = []
    source = bench.input(plan.scaling_events, plan.partitions)
    for size in plan.scaling_epoch_records:
        for run_no in range(plan.scaling_runs):
            for config in (EO, ALO) if run_no % 2 == 0 else (ALO, EO):
                bench.say(f"epoch size {size:,}: run {run_no + 1}/{plan.scaling_runs}: {config} ...")
                row = measure(bench, "stateless", config, source, size)
                row["run"] = run_no
                size_rows.append(row)
                bench.say(f"epoch size {size:,}: {config}: {brief(row)}")
    return {
        "events": plan.scaling_events,
        "epoch_records": plan.epoch_records,
        "partitions": partitions_rows,
        "epoch_sizes": size_rows,
    }

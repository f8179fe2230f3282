"""9. Fixed cost per epoch: exactly-once epochs that carry (almost) nothing.

Spark runs no micro-batch when no source has new data (a stateless query makes no empty
batches), so the smallest epoch eos can run is a tiny one: `max_records_per_epoch` of a few
records, over the 4-partition input, available-now, until the input is consumed. What such an
epoch costs is the per-epoch fixed cost: planning and logging the offsets (Spark), the Spark job
(task launch, Python workers, the read's consumer seek and fetch, the slots' produce and
pre-commit), the decision, the commits, and Spark's commit log. The first epochs of a run (query
start-up, code generation) are left out. Paired rounds with eos at-least-once on the same input
show what exactly-once adds per epoch, and Spark's built-in Kafka connector on the same input and
epoch size (`maxOffsetsPerTrigger`) shows Spark's own floor: what any micro-batch costs before a
sink does anything. Targets: the exactly-once median ≤ 0.25 s (met since 2026-11-25), ≤ 50 ms
(issue 38: below Spark's floor, so not reachable by eos's side alone; docs/EXACTLY_ONCE.md).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.context import Bench
from bench.procs import CpuMeter
from bench.runs import ALO, BUILTIN, EO, OURS, brief, measure, warm_up
from bench.stats import percentile, summarize
from eos.protocol.report import EpochListener

SKIP_FIRST = 2  # query start-up and the first code generation


class SteadyCpu(EpochListener):
    """CPU of every process of ours from the start of epoch SKIP_FIRST to the last commit.

    A reading scans /proc (~11 ms of the driver's CPU): it is taken on a thread of its own after a
    commit, so the epochs it measures do not include it (read inside the listener, it was in every
    epoch's time, and it was most of the driver's protocol-side time per epoch), and its own CPU is
    taken off the driver's. A reading whose commit a later one already follows is skipped."""

    def __init__(self, driver: int, broker: int | None):
        self.meter = CpuMeter(driver, broker)
        self.started = False
        self.epochs = 0
        self.cpu: dict[str, float] = {}
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-steady-cpu")
        self._own_cpu = 0.0
        self._read_epochs = 0

    def _read(self, epochs: int) -> None:
        if epochs != self.epochs:
            return  # a later commit's reading is queued behind this one
        before = time.thread_time()
        cpu = self.meter.stop()
        self._own_cpu += time.thread_time() - before
        cpu["driver"] = round(max(0.0, cpu.get("driver", 0.0) - self._own_cpu), 3)
        self.cpu, self._read_epochs = cpu, epochs

    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        if epoch >= SKIP_FIRST and not self.started:
            self.meter.start()
            self.started = True

    def on_epoch_committed(self, report: Any) -> None:
        if self.started:
            self.epochs += 1
            self._reader.submit(self._read, self.epochs)

    def result(self) -> dict[str, Any]:
        self._reader.shutdown(wait=True)  # the reading after the last commit
        return {"epochs": self._read_epochs, "cpu": self.cpu}


def steady(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in row["epochs"] if e["epoch"] >= SKIP_FIRST and e["trigger_s"] > 0]


def per_epoch(row: dict[str, Any]) -> dict[str, Any]:
    """Medians (s) of a run's steady epochs: the whole epoch and its parts."""
    epochs = steady(row)
    keys = ("trigger_s", "plan_s", "job_s", "write_s", "precommit_s", "decide_s", "commit_s", "driver_s", "mark_s")
    out: dict[str, Any] = {"epochs": len(epochs)}
    for key in keys:  # the built-in connector's epochs have Spark's parts only
        values = [e[key] for e in epochs if key in e]
        out[key] = summarize(values).median if values else None
    if epochs:
        triggers = [e["trigger_s"] for e in epochs]
        out["p90_trigger_s"] = percentile(triggers, 90)
        out["other_s"] = summarize(
            [max(0.0, e["trigger_s"] - e["plan_s"] - e["add_batch_s"] - e["mark_s"]) for e in epochs]
        ).median
        out["records_per_epoch"] = summarize([e.get("input_rows") or 0 for e in epochs]).median
        steady_cpu = row.get("steady_cpu") or {}
        if steady_cpu.get("epochs"):
            out["cpu_ms_per_epoch"] = sum(steady_cpu["cpu"].get(k, 0.0) for k in OURS) * 1000 / steady_cpu["epochs"]
    return out


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    warm_up(bench)
    source = bench.input(plan.epoch_cost_events, plan.partitions)
    runs: dict[str, list[dict[str, Any]]] = {EO: [], ALO: [], BUILTIN: []}
    for round_no in range(plan.rounds):
        for config in (EO, ALO, BUILTIN) if round_no % 2 == 0 else (BUILTIN, ALO, EO):
            bench.say(
                f"fixed cost: round {round_no + 1}/{plan.rounds}: {config}, {plan.epoch_cost_records}-record epochs ..."
            )
            meter = SteadyCpu(os.getpid(), bench.broker_pid) if config != BUILTIN else None
            listeners = [meter] if meter is not None else None
            row = measure(bench, "stateless", config, source, plan.epoch_cost_records, listeners=listeners)
            row["steady_cpu"] = meter.result() if meter is not None else None
            row["round"] = round_no
            row["per_epoch"] = per_epoch(row)
            runs[config].append(row)
            pe = row["per_epoch"]
            bench.say(
                f"fixed cost: {config}: {brief(row)}; median epoch {1000 * (pe['trigger_s'] or 0):.0f} ms "
                f"over {pe['epochs']} epochs"
            )
    return {"epoch_records": plan.epoch_cost_records, "input": source.__dict__, "runs": runs}

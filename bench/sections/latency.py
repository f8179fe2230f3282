"""2. Latency: produce time -> visible to a read_committed reader, p50/p99, per trigger interval.

The stateless pipeline runs on a processing-time trigger while bench.probe (its own process)
writes live events at a steady rate and reads the output. Baselines: the same pipeline in
eos at-least-once mode (its records become visible as soon as they are produced; exactly-once
ones at commit) and on Spark's built-in Kafka connector, at the same trigger. Target:
exactly-once p99 <= trigger + 1 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.builtin import run_builtin
from bench.context import Bench
from bench.env import REPO
from bench.inputs import delete_topics, eos_topics, ready_topic
from bench.pipelines import run_eos, stateless_config, unique
from bench.runs import ALO, BUILTIN, EO, warm_up
from eos.config import parse_duration


def one_run(bench: Bench, trigger: str, mode: str, rate: int | None = None, hot: int | None = None) -> dict[str, Any]:
    """One latency run. `hot`: records placed on the input's partitions, partition 0 at `hot` times
    the rate of each other one (`rate` is then the total); else placed by key hash."""
    plan = bench.plan
    slug = {EO: "eo", ALO: "alo", BUILTIN: "spark"}[mode]
    name = unique(f"bench-latency-{slug}")
    in_topic, out_topic = f"{name}-in", f"{name}-out"
    ready_topic(bench.bootstrap, in_topic, plan.partitions)
    ready_topic(bench.bootstrap, out_topic, 4)
    result_file = bench.work / f"{name}.json"
    drain = max(30.0, 4 * parse_duration(trigger))
    probe_args = {
        "--bootstrap": bench.bootstrap,
        "--input": in_topic,
        "--output": out_topic,
        "--rate": rate or plan.latency_rate,
        "--warmup": plan.latency_warmup_s,
        "--measure": plan.latency_measure_s,
        "--drain": drain,
        "--result": result_file,
    }
    if hot is not None:
        probe_args.update({"--partitions": plan.partitions, "--hot": hot})
    probe = subprocess.Popen(
        [sys.executable, "-m", "bench.probe", *(str(x) for pair in probe_args.items() for x in pair)], cwd=REPO
    )
    config = stateless_config(
        name=name,
        bootstrap=bench.bootstrap,
        topic=in_topic,
        out_topic=out_topic,
        checkpoint=bench.checkpoint(name),
        mode="exactly-once" if mode == EO else "at-least-once",
        epoch_records=None,
        trigger=trigger,
    )

    def probe_done() -> bool:
        return probe.poll() is not None

    try:
        if mode == BUILTIN:
            interval = f"{int(parse_duration(trigger) * 1000)} milliseconds"
            run = run_builtin(
                bench.spark,
                config,
                bench.work,
                bench.bootstrap,
                out_topic,
                bench.checkpoint(name),
                None,
                bench.broker_pid,
                trigger=interval,
                stop_when=probe_done,
            )
        else:
            run = run_eos(bench.spark, config, bench.work, bench.broker_pid, trigger=trigger, stop_when=probe_done)
    finally:
        if probe.poll() is None:
            probe.kill()
        probe.wait()
    probe_result = json.loads(result_file.read_text()) if result_file.exists() else {"error": "the probe wrote nothing"}
    delete_topics(bench.bootstrap, [in_topic, out_topic, *eos_topics(name)])
    row = {"trigger": trigger, "mode": mode, **probe_result, "epochs": run.epochs, "cpu": run.cpu}
    visible = probe_result.get("produced")
    if visible:
        ours = sum(run.cpu.get(k, 0.0) for k in ("driver", "spark_jvm", "python_workers", "broker", "tools"))
        row["cpu_us_per_record"] = ours * 1e6 / visible
    return row


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    warm_up(bench, force=True)
    rows: list[dict[str, Any]] = []
    for trigger in plan.latency_triggers:
        for run_no in range(plan.latency_runs):
            for mode in (EO, ALO, BUILTIN) if run_no % 2 == 0 else (BUILTIN, ALO, EO):
                bench.say(
                    f"trigger {trigger}: run {run_no + 1}/{plan.latency_runs}: {mode} "
                    f"({plan.latency_rate} rec/s, {plan.latency_warmup_s:.0f}s warm-up + "
                    f"{plan.latency_measure_s:.0f}s measured) ..."
                )
                row = one_run(bench, trigger, mode)
                row["run"] = run_no
                rows.append(row)
                bench.say(
                    f"trigger {trigger}: {mode}: p50 {row.get('p50_s', float('nan')):.2f}s "
                    f"p99 {row.get('p99_s', float('nan')):.2f}s ({row.get('visible')} of {row.get('expected')} "
                    "records seen)"
                )
    return {
        "rate": plan.latency_rate,
        "warmup_s": plan.latency_warmup_s,
        "measure_s": plan.latency_measure_s,
        "runs": rows,
    }

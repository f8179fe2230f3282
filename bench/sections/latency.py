"""2. Latency: produce time -> visible to a read_committed reader, p50/p99, per trigger interval.

The stateless pipeline runs on a processing-time trigger while bench.probe (its own process)
writes live events at a steady rate and reads the output. Baselines: the same pipeline in
eos at-least-once mode (its records become visible as soon as they are produced; exactly-once
ones at commit) and on Spark's built-in Kafka connector, at the same trigger. Target:
exactly-once p99 <= trigger + 1 s.

With the 100 ms trigger's runs, the same probe on the Kafka Streams peer (bench/peers: the same
pipeline, exactly_once_v2 with its default commit.interval.ms of 100 ms, two stream threads as in
the peers section), on the same broker and input shape. Its stream threads run before the probe
writes its first record (the probe's warm-up then covers the same steady state as for eos, whose
query starts on a warm session). Target there: exactly-once p99 <= 300 ms, and no worse than
Kafka Streams' p99 in the same run.

Each Spark configuration first runs once at the first trigger, discarded: the section's warm-up.
Spark plans every micro-batch anew, and its planner's code reaches the JIT's thresholds only after
some hundreds of epochs: on 2026-11-28 the first measured run of the session (exactly-once at
100 ms, after the throughput-sized warm-up of bench.runs.warm_up, whose few large epochs do not
warm the planner) read p99 0.93 s, and the same configuration later in the same section 0.31 s. A
pipeline that runs for hours is past that; with two runs per trigger, one cold run was half of the
median. The discarded runs also start what bench.runs.warm_up would (Python workers, the first
query plans), so the section does not run that one too.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.builtin import run_builtin
from bench.context import Bench
from bench.env import REPO
from bench.inputs import delete_topics, eos_topics, ready_topic
from bench.pipelines import run_eos, unique
from bench.procs import CpuMeter
from bench.runs import ALO, BUILTIN, EO, cpu_per_record
from bench.sections.peers import KSTREAMS
from eos.config import parse_duration

MODES = (EO, ALO, BUILTIN)
SLUGS = {EO: "eo", ALO: "alo", BUILTIN: "spark", KSTREAMS: "kstreams"}
# Kafka Streams commits every 100 ms under exactly_once_v2 by default: its runs go with this trigger's.
KSTREAMS_TRIGGER = "100ms"


def modes(trigger: str) -> tuple[str, ...]:
    """The configurations measured at `trigger`."""
    return (*MODES, KSTREAMS) if trigger == KSTREAMS_TRIGGER else MODES


def one_run(bench: Bench, trigger: str, mode: str, rate: int | None = None, hot: int | None = None) -> dict[str, Any]:
    """One latency run. `hot`: records placed on the input's partitions, partition 0 at `hot` times
    the rate of each other one (`rate` is then the total); else placed by key hash."""
    plan = bench.plan
    name = unique(f"bench-latency-{SLUGS[mode]}")
    in_topic, out_topic = f"{name}-in", f"{name}-out"
    ready_topic(bench.bootstrap, in_topic, plan.partitions)
    ready_topic(bench.bootstrap, out_topic, 4)
    result_file = bench.work / f"{name}.json"
    drain = max(30.0, 4 * parse_duration(trigger))
    with contextlib.ExitStack() as stack:
        if mode == KSTREAMS:
            from bench.peers import live_kstreams

            limit = plan.latency_warmup_s + plan.latency_measure_s + drain + 120
            peer = live_kstreams(bench.bootstrap, in_topic, out_topic, work_dir=bench.work, timeout_s=limit)
            stack.enter_context(peer)
        probe = stack.enter_context(_probe(bench, in_topic, out_topic, result_file, drain, rate, hot))
        epochs, cpu = _measure(bench, mode, name, trigger, in_topic, out_topic, lambda: probe.poll() is not None)
    probe_result = json.loads(result_file.read_text()) if result_file.exists() else {"error": "the probe wrote nothing"}
    delete_topics(bench.bootstrap, [in_topic, out_topic, *eos_topics(name)])
    row = {"trigger": trigger, "mode": mode, **probe_result, "epochs": epochs, "cpu": cpu}
    if mode == KSTREAMS:
        row["commit_interval_ms"] = 100
    if probe_result.get("produced"):
        row["cpu_us_per_record"] = cpu_per_record({"cpu": cpu, "records_in": probe_result["produced"]})
    return row


@contextlib.contextmanager
def _probe(
    bench: Bench, in_topic: str, out_topic: str, result: Path, drain: float, rate: int | None, hot: int | None
) -> Iterator[subprocess.Popen]:
    """bench.probe, writing to `in_topic` and reading `out_topic`; killed on leaving if still running."""
    plan = bench.plan
    args = {
        "--bootstrap": bench.bootstrap,
        "--input": in_topic,
        "--output": out_topic,
        "--rate": rate or plan.latency_rate,
        "--warmup": plan.latency_warmup_s,
        "--measure": plan.latency_measure_s,
        "--drain": drain,
        "--result": result,
    }
    if hot is not None:
        args.update({"--partitions": plan.partitions, "--hot": hot})
    probe = subprocess.Popen(
        [sys.executable, "-m", "bench.probe", *(str(x) for pair in args.items() for x in pair)], cwd=REPO
    )
    try:
        yield probe
    finally:
        if probe.poll() is None:
            probe.kill()
        probe.wait()


def _measure(
    bench: Bench, mode: str, name: str, trigger: str, in_topic: str, out_topic: str, done: Callable[[], bool]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Run `mode`'s pipeline until `done()`; returns its epochs (none for Kafka Streams) and CPU."""
    if mode == KSTREAMS:  # it runs in a process of its own, already started
        meter = CpuMeter(os.getpid(), bench.broker_pid)
        meter.start()
        while not done():
            time.sleep(0.25)
        return [], meter.stop()
    config = bench.config("stateless", name, in_topic, out_topic, mode == EO, trigger=trigger)
    if mode == BUILTIN:
        interval = f"{int(parse_duration(trigger) * 1000)} milliseconds"
        run = run_builtin(
            bench.spark, config, bench.work, bench.bootstrap, out_topic, bench.checkpoint(name), None,
            bench.broker_pid, trigger=interval, stop_when=done,
        )  # fmt: skip
    else:
        run = run_eos(bench.spark, config, bench.work, bench.broker_pid, trigger=trigger, stop_when=done)
    return run.epochs, run.cpu


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    if KSTREAMS_TRIGGER in plan.latency_triggers:
        from bench.peers import kstreams_classpath

        kstreams_classpath(bench.say)  # built once (cached): a failed build stops here, not mid-run
    warm_ups = []
    for mode in MODES:  # discarded (see the module doc); Kafka Streams starts a JVM of its own each run
        bench.say(f"warm-up: trigger {plan.latency_triggers[0]}: {mode} (discarded) ...")
        row = one_run(bench, plan.latency_triggers[0], mode)
        warm_ups.append({key: row.get(key) for key in ("trigger", "mode", "p50_s", "p99_s", "visible", "expected")})
    rows: list[dict[str, Any]] = []
    for trigger in plan.latency_triggers:
        for run_no in range(plan.latency_runs):
            for mode in modes(trigger) if run_no % 2 == 0 else modes(trigger)[::-1]:
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
        "warm_ups": warm_ups,
    }

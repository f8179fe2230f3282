"""Profiles: where the time goes, for the notes on missed targets.

During one stateless run of each configuration (eos exactly-once, eos at-least-once, Spark's
built-in connector) on a warm session:
- py-spy samples (on-CPU only) the driver (this process) and every Spark Python worker (the
  pyspark.daemon processes and the workers they fork);
- Java Flight Recorder samples the Spark JVM's Java threads;
- /proc gives the CPU seconds of each process class (Spark JVM, Python workers, driver, broker,
  the rest of the machine).
And py-spy on this process during the raw confluent-kafka loop. A warm-up run comes first:
Spark kills Python workers idle for a minute, and a new worker's start-up is not the
steady state.
"""

from __future__ import annotations

import os
from typing import Any

from bench.context import Bench
from bench.inputs import delete_topics, ready_topic
from bench.procs import descendants, snapshot, worker_roots
from bench.profiling import JvmRecorder, Recorder, jvm_summary, summarize
from bench.runs import ALO, BUILTIN, EO, RAW, brief, measure
from bench.steps import step_costs


def _spark_jvm() -> int | None:
    procs = snapshot()
    return next((pid for pid in descendants(os.getpid(), procs) if "SparkSubmit" in procs[pid].cmdline), None)


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.profile_events, plan.partitions)
    bench.warm_up(force=True)
    out: dict[str, Any] = {"input_records": source.records, "epoch_records": plan.epoch_records, "runs": {}}
    jvm_pid = _spark_jvm()
    for config in (EO, ALO, BUILTIN, RAW):
        folder = bench.work / "profiles" / config.replace(" ", "-").replace(",", "")
        recorder = Recorder(folder)
        recorder.attach("driver", os.getpid())
        jvm = None
        if config != RAW:
            for pid in worker_roots(os.getpid()):
                recorder.attach("workers", pid, subprocesses=True)
            if jvm_pid is not None:
                jvm = JvmRecorder(folder / "spark-jvm.jfr", jvm_pid)
                if not jvm.start():
                    jvm = None
        bench.say(f"profiling {config} (py-spy: {len(recorder.procs)} processes; JFR: {'on' if jvm else 'off'}) ...")
        try:
            row = measure(bench, "stateless", config, source, plan.epoch_records)
        finally:
            files = recorder.stop()
            jfr = jvm.stop() if jvm is not None else None
        bench.say(f"profiled {config}: {brief(row)}")
        profiles = {label: summarize(paths) for label, paths in files.items()}
        if jfr is not None:
            profiles["spark_jvm"] = jvm_summary(jfr)
        out["runs"][config] = {
            "rps_wall": row["rps_wall"],
            "wall_s": row["wall_s"],
            "cpu": row["cpu"],
            "spans": row.get("spans", {}),
            "epochs": row["epochs"],
            "profiles": profiles,
        }
    bench.say("profile: the data path's Python steps, one process (bench/steps.py) ...")
    steps_out = f"bench-steps-{os.getpid()}"
    ready_topic(bench.bootstrap, steps_out, plan.partitions)
    out["steps"] = step_costs(bench.bootstrap, source.topic, steps_out)
    delete_topics(bench.bootstrap, [steps_out])
    return out

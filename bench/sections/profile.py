"""Profiles: where the time goes, for the notes on missed targets.

During one run of each Spark configuration (eos exactly-once, eos at-least-once, Spark's
built-in connector) on each pipeline (stateless, stateful), on a warm session:
- py-spy samples (on-CPU only) the driver (this process) and every Spark Python worker (the
  pyspark.daemon processes and the workers they fork);
- async-profiler samples every thread of the Spark JVM by its CPU time, Java and native code
  alike (bench/jvmprofile.py: RocksDB, compression, the JIT compilers and the garbage collector
  run native code, which Java Flight Recorder's samples do not see);
- /proc gives the CPU seconds of each process class (Spark JVM, Python workers, driver, broker,
  the rest of the machine).
And py-spy on this process during the raw confluent-kafka loop; one more eos exactly-once run in
tiny epochs (the fixed-cost section's size: where the per-epoch cost goes); and bench/steps.py,
the data path's Python work step by step in one process. A warm-up run comes first: Spark kills
Python workers idle for a minute, and a new worker's start-up is not the steady state.
"""

from __future__ import annotations

import os
from typing import Any

from bench.context import Bench
from bench.inputs import delete_topics, ready_topic
from bench.jvmprofile import VERSION, JvmRecorder, jvm_summary, library
from bench.procs import descendants, snapshot, worker_roots
from bench.profiling import Recorder, summarize
from bench.runs import ALO, BUILTIN, EO, RAW, brief, measure, warm_up
from bench.steps import step_costs

TINY = "eos exactly-once, tiny epochs"
STATEFUL = ", stateful"  # the label of a stateful run: its configuration and this


def _spark_jvm() -> int | None:
    procs = snapshot()
    return next((pid for pid in descendants(os.getpid(), procs) if "SparkSubmit" in procs[pid].cmdline), None)


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.profile_events, plan.partitions)
    warm_up(bench, force=True, pipelines=("stateless", "stateful"))
    out: dict[str, Any] = {"input_records": source.records, "epoch_records": plan.epoch_records, "runs": {}}
    jvm_pid = _spark_jvm()
    profiler, why_not = library(bench.say)
    out["jvm_profiler"] = f"async-profiler {VERSION}" if profiler is not None else None
    if profiler is None:
        bench.say(f"profile: no JVM profile: {why_not}")
        out["jvm_profiler_missing"] = why_not
    tiny = bench.input(plan.epoch_cost_events, plan.partitions)
    runs = [(c, c, "stateless", source, plan.epoch_records) for c in (EO, ALO, BUILTIN, RAW)]
    runs.append((TINY, EO, "stateless", tiny, plan.epoch_cost_records))  # where the fixed cost per epoch goes
    runs += [(c + STATEFUL, c, "stateful", source, plan.epoch_records) for c in (EO, ALO, BUILTIN)]
    for label_, config, pipeline, input_, epoch_records in runs:
        folder = bench.work / "profiles" / label_.replace(" ", "-").replace(",", "")
        recorder = Recorder(folder)
        recorder.attach("driver", os.getpid())
        jvm = None
        if config != RAW:
            for pid in worker_roots(os.getpid()):
                recorder.attach("workers", pid, subprocesses=True)
            if jvm_pid is not None and profiler is not None:
                jvm = JvmRecorder(profiler, folder / "spark-jvm.collapsed", jvm_pid)
                if not jvm.start():
                    jvm = None
        on = "on" if jvm else "off"
        bench.say(f"profiling {label_} (py-spy: {len(recorder.procs)} processes; async-profiler: {on}) ...")
        try:
            row = measure(bench, pipeline, config, input_, epoch_records)
        finally:
            files = recorder.stop()
            collapsed = jvm.stop() if jvm is not None else None
        bench.say(f"profiled {label_}: {brief(row)}")
        profiles = {label: summarize(paths) for label, paths in files.items()}
        if collapsed is not None:
            profiles["spark_jvm"] = jvm_summary(collapsed)
        out["runs"][label_] = {
            "pipeline": pipeline,
            "records_in": row["records_in"],
            "epoch_records": epoch_records,
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

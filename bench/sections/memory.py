"""6. Memory: peak RSS of the driver, the Spark JVM and the Python workers over a long run.

The stateful pipeline (the demo's: dedup state and window state, in Spark's in-memory state
store) runs as `python -m eos run` on a 1 s trigger for the whole duration while bench.probe feeds
it live events at a steady rate; every 2 s the memory of each process class is sampled from
/proc: RSS of the largest process, RSS summed, and PSS summed (forked Python workers share pages
with their daemon, which RSS would count several times). Flat means: after the warm-up (the first
fifth of the run), the peak of the last third is within 10% of the peak of the first third (the
baseline), and the fitted slope is small. The JVM's heap is capped by spark.driver.memory (1g,
PySpark's default), and G1 touches more of it as it goes, so the JVM's RSS may grow towards the
cap without a leak: every tenth of the run the JVM's live heap is also counted (`jcmd
GC.class_histogram`: a full collection, then the bytes of the reachable objects); that and the
JVM's memory outside the heap (RSS minus the heap's resident pages: Arrow, metaspace, threads)
are the JVM's verdicts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import yaml

from bench.context import Bench
from bench.env import REPO
from bench.inputs import delete_topics, eos_topics
from bench.pipelines import unique
from bench.procs import live_heap, memory_by_class, spark_jvms
from bench.subproc import EosProcess, committed_epochs, wait_committed
from eos_connectors.kafka.clients import admin_client, create_topic

SAMPLE_EVERY_S = 2.0
HEAP_SAMPLES = 10  # full collections over the run (each pauses the JVM for a fraction of a second)


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    name = unique("bench-memory")
    in_topic, out_topic = f"{name}-in", f"{name}-out"
    admin = admin_client({"bootstrap.servers": bench.bootstrap})
    create_topic(admin, in_topic, plan.partitions)
    config = bench.config("stateful", name, in_topic, out_topic, trigger="1s")
    pipeline_file = bench.work / f"{name}.yaml"
    pipeline_file.write_text(yaml.safe_dump(config, sort_keys=False))
    result_file = bench.work / f"{name}-load.json"
    generator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.probe",
            "--bootstrap",
            bench.bootstrap,
            "--input",
            in_topic,
            "--rate",
            str(plan.memory_rate),
            "--warmup",
            "0",
            "--measure",
            str(plan.memory_duration_s + 30),
            "--no-probe",
            "--result",
            str(result_file),
        ],
        cwd=REPO,
    )
    logs = bench.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    eos = EosProcess(pipeline_file, log=logs / f"{name}.log")
    samples: list[dict[str, Any]] = []
    try:
        if wait_committed(eos, bench.checkpoint(name), 0, timeout=180) is None:
            raise RuntimeError(f"the memory run never committed an epoch:\n{eos.tail()}")
        started = time.monotonic()
        next_report = started + 60
        heap_every = max(SAMPLE_EVERY_S, plan.memory_duration_s / HEAP_SAMPLES)
        next_heap = started + heap_every / 2
        jvms = spark_jvms(eos.pid)
        while time.monotonic() - started < plan.memory_duration_s:
            if eos.proc.poll() is not None:
                raise RuntimeError(f"the memory run ended early:\n{eos.tail()}")
            sample = {"t_s": round(time.monotonic() - started, 1), **memory_by_class(eos.pid, None)}
            if len(jvms) == 1 and time.monotonic() >= next_heap:
                next_heap += heap_every
                heap = live_heap(jvms[0])
                if heap is not None:
                    sample["spark_heap"] = heap
            samples.append(sample)
            if time.monotonic() >= next_report:
                next_report += 60
                latest = samples[-1]
                bench.say(
                    f"memory: {latest['t_s']:.0f}/{plan.memory_duration_s:.0f}s: "
                    + ", ".join(f"{k} {v['rss_sum_mib']:.0f} MiB" for k, v in latest.items() if isinstance(v, dict))
                )
            time.sleep(SAMPLE_EVERY_S)
        epochs = committed_epochs(bench.checkpoint(name))
        eos.terminate()
        if eos.wait(120) is None:
            eos.kill_group()
    finally:
        eos.kill_group()
        if generator.poll() is None:
            generator.kill()
        generator.wait()
    delete_topics(bench.bootstrap, [in_topic, out_topic, *eos_topics(name)])
    return {
        "duration_s": plan.memory_duration_s,
        "rate": plan.memory_rate,
        "epochs": epochs,
        "samples": samples,
        "exit_code": eos.proc.returncode,
    }

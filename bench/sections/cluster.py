"""11. A Spark standalone cluster against local mode, and scale-out by executor cores.

The stateless pipeline, exactly-once, available-now, submitted with `spark-submit` (a cold driver
per run, as in production: bench/cluster_app.py is eos/job.py's `eos run` with the benchmark's
listener) on the same 4-partition input:
- `local[2]` (local[*] on this machine): every task in the driver's JVM;
- a standalone cluster on this machine (eos_ops.sparkcluster.LocalSparkCluster: 2 workers of 2
  cores), the application given 1, 2 and 4 executor cores in total (`spark.cores.max`; 1 core per
  executor up to 2, then 2 executors of 2 cores), with as many slots as cores.
Records/s is input records over the driver's `run_config` wall time (JVM start-up, executor
registration not included); the epoch time is Spark's triggerExecution. Ratios are against
`local[2]` of the same round. On a 2-core machine shared with the broker, 4 executor cores are
oversubscribed: the section reports where the time goes (fixed cost per epoch, CPU per record by
process) and projects, on paper, a 16-partition, 16-core cluster from those two measured costs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.context import Bench
from bench.env import REPO
from bench.inputs import count_records, delete_topics, eos_topics
from bench.pipelines import unique
from bench.procs import SampledCpuMeter
from bench.runs import OURS
from bench.stats import line_fit, summarize

LOCAL = "local[2]"
CORES = (1, 2, 4)


def _submit_conf(cores: int) -> dict[str, str]:
    per_executor = 1 if cores <= 2 else 2
    return {"spark.cores.max": str(cores), "spark.executor.cores": str(per_executor)}


def _launch(command: list[str], env: dict[str, str], folder: Path) -> subprocess.Popen:
    with open(folder / "submit.log", "wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )


def _finish(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"spark-submit did not finish within {timeout_s:.0f} s") from None


def _tail(folder: Path) -> str:
    logs = sorted(folder.glob("*.log"))
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-30:]) if logs else "(no log)"


def one_run(bench: Bench, cluster: Any, where: str, cores: int, source: Any) -> dict[str, Any]:
    name = unique(f"bench-cluster-{where.replace('[', '').replace(']', '')}-{cores}")
    out_topic = f"{name}-out"
    config = bench.config("stateless", name, source.topic, out_topic, epoch_records=bench.plan.epoch_records)
    config["epochs"]["slots"] = cores
    folder = bench.work / name
    folder.mkdir(parents=True)
    config_file, result_file = folder / "pipeline.json", folder / "result.json"
    config_file.write_text(json.dumps(config))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    app = REPO / "bench" / "cluster_app.py"
    conf = {"spark.sql.shuffle.partitions": str(cores), "spark.default.parallelism": str(cores)}
    if where != LOCAL:
        conf.update(_submit_conf(cores))
    meter = SampledCpuMeter(os.getpid(), bench.broker_pid)
    meter.start()
    started = time.monotonic()
    # The same spark-submit command, settings and environment for both; local mode swaps the master.
    command = cluster.submit_command(app, [str(config_file), str(result_file)], conf)
    if where == LOCAL:
        command[command.index("--master") + 1] = LOCAL
    proc = _launch(command, {**cluster.environment(), **env}, folder)
    try:
        _finish(proc, bench.plan.cluster_timeout_s)
    finally:
        submit_s = time.monotonic() - started
        cpu = meter.stop()
    if not result_file.exists():
        raise RuntimeError(f"{where} ({cores} cores): the application wrote no result; log:\n{_tail(folder)}")
    result = json.loads(result_file.read_text())
    epochs = result["epochs"]
    steady = [e for e in epochs if e["epoch"] >= 1]
    row = {
        "where": where,
        "cores": cores,
        "records_in": source.records,
        "records_out": count_records(bench.bootstrap, out_topic),
        "wall_s": result["wall_s"],
        "submit_s": submit_s,
        "rps_wall": source.records / result["wall_s"],
        "epochs": epochs,
        "epoch_s": summarize([e["trigger_s"] for e in steady]).to_dict(),
        "epoch_time_s": sum(e["trigger_s"] for e in epochs),
        "cpu": cpu,
    }
    row["rps_epochs"] = source.records / row["epoch_time_s"] if row["epoch_time_s"] else None
    # Epoch 0 of a cold driver starts the executors' Python workers and compiles: left out here.
    steady_s = sum(e["trigger_s"] for e in steady)
    steady_records = sum(e.get("input_rows") or 0 for e in steady)
    row["rps_steady"] = steady_records / steady_s if steady_s else None
    row["cpu_us_per_record"] = sum(cpu.get(k, 0.0) for k in OURS) * 1e6 / source.records
    delete_topics(bench.bootstrap, [out_topic, *eos_topics(name)])
    return row


def projection(rows: list[dict[str, Any]], epoch_records: int) -> dict[str, Any]:
    """A 16-partition, 16-core cluster on paper, from two measured costs of the cluster runs: the
    fixed cost per epoch (line fit of epoch time against records per epoch, over every cluster
    epoch) and the task CPU per record (executor JVMs and Python workers, from /proc, at the
    largest core count run; the driver's JVM is in that figure too, so it errs high). Assumes the
    broker and the driver are on machines of their own, the per-record work divides evenly over
    the cores (16 partitions, 16 slots), and the fixed cost per epoch does not grow with the
    number of tasks."""
    cluster_epochs = [e for r in rows if r["where"] != LOCAL for e in r["epochs"] if e["epoch"] >= 1]
    xs = [float(e.get("input_rows") or 0) for e in cluster_epochs]
    ys = [e["trigger_s"] for e in cluster_epochs]
    fixed_s, per_record_s, r2 = line_fit(xs, ys)
    widest_cores = max((r["cores"] for r in rows if r["where"] != LOCAL), default=0)
    widest = [r for r in rows if r["where"] != LOCAL and r["cores"] == widest_cores]
    task_cpu = [
        (r["cpu"].get("spark_jvm", 0.0) + r["cpu"].get("python_workers", 0.0)) / r["records_in"] for r in widest
    ]
    cpu_per_record = summarize(task_cpu).median
    out: dict[str, Any] = {
        "fixed_s": fixed_s,
        "per_record_wall_us": per_record_s * 1e6 if per_record_s == per_record_s else None,
        "r2": r2,
        "task_cpu_us_per_record": cpu_per_record * 1e6 if cpu_per_record == cpu_per_record else None,
        "epoch_records": epoch_records,
    }
    if fixed_s == fixed_s and cpu_per_record == cpu_per_record:
        for cores in (2, 4, 16):
            for size in (epoch_records, 10 * epoch_records):
                epoch_s = max(fixed_s, 0.0) + size * cpu_per_record / cores
                out[f"rps_{cores}_cores_{size}"] = size / epoch_s
    return out


def run(bench: Bench) -> dict[str, Any]:
    from eos_ops.sparkcluster import LocalSparkCluster

    plan = bench.plan
    source = bench.input(plan.cluster_events, plan.partitions)
    rows: list[dict[str, Any]] = []
    with LocalSparkCluster(bench.work / "spark-cluster", workers=2, cores_per_worker=2) as cluster:
        bench.say("cluster: starting a Spark standalone master and 2 workers of 2 cores ...")
        started = time.monotonic()
        cluster.start(progress=bench.say)
        start_s = time.monotonic() - started
        cores = getattr(plan, "cluster_cores", CORES)  # quick: 2 only
        configs = [(LOCAL, 2), *(("standalone", c) for c in cores)]
        for round_no in range(plan.cluster_rounds):
            order = configs[round_no % len(configs) :] + configs[: round_no % len(configs)]
            for where, cores in order:
                bench.say(f"cluster: round {round_no + 1}/{plan.cluster_rounds}: {where}, {cores} cores ...")
                row = one_run(bench, cluster, where, cores, source)
                row["round"] = round_no
                rows.append(row)
                bench.say(
                    f"cluster: {where} {cores} cores: {row['rps_wall']:,.0f} rec/s (wall {row['wall_s']:.1f}s, "
                    f"median epoch {row['epoch_s']['median']:.2f}s, {row['cpu_us_per_record']:,.0f} µs CPU/rec, "
                    f"{row['records_out']:,} out)"
                )
    return {
        "input": source.__dict__,
        "epoch_records": plan.epoch_records,
        "cluster_start_s": start_s,
        "runs": rows,
        "projection": projection(rows, plan.epoch_records),
    }

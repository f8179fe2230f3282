"""4. Recovery: kill -9 at a failpoint, restart, time to the first committed epoch.

`python -m eos run` (a process of its own, cold JVM, as an operator would restart it) on the
stateless pipeline, with `--failpoint POINT=kill@epoch=2`: the failpoint kills the driver's
process group (driver, Spark JVM, Python workers). The benchmark then restarts the same command
and times, from the restart command: the recovery line (fencing done, ledger read) and the first
epoch Spark marks committed (a new file in the checkpoint's commit log, polled every 20 ms).
Baseline: the same command's cold start to its first committed epoch,
in the same run (a restart cannot be faster than a cold start: both start a JVM). Separately:
from the kill to the process group being gone, and from there to the restart. After the
restarted run drains the input, the committed output is checked: exactly the expected records.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from bench.context import Bench
from bench.inputs import count_records, delete_topics, eos_topics, expected_stateless_out
from bench.pipelines import unique
from bench.subproc import EosProcess, committed_epochs, wait_committed, wait_group_gone

KILL_EPOCH = 2


def one_run(bench: Bench, point: str, expected: int, topic: str) -> dict[str, Any]:
    plan = bench.plan
    name = unique("bench-recovery")
    out_topic = f"{name}-out"
    config = bench.config("stateless", name, topic, out_topic, epoch_records=plan.recovery_epoch_records)
    checkpoint = bench.checkpoint(name)
    pipeline_file = bench.work / f"{name}.yaml"
    pipeline_file.write_text(yaml.safe_dump(config, sort_keys=False))
    logs = bench.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    row: dict[str, Any] = {"point": point, "kill_epoch": KILL_EPOCH}
    first = EosProcess(pipeline_file, "--failpoint", f"{point}=kill@epoch={KILL_EPOCH}", log=logs / f"{name}-1.log")
    try:
        first_commit = wait_committed(first, checkpoint, 0, timeout=300)
        killed = first.first(r"eos failpoint: kill -9", timeout=300)
        exited = first.wait(300)
    finally:
        first.kill_group()
    if killed is None or exited is None or first_commit is None:
        raise RuntimeError(f"the failpoint {point} did not kill the run as planned:\n{first.tail()}")
    gone = wait_group_gone(first.pid)
    row.update(
        exit_code=first.proc.returncode,
        cold_start_to_first_commit_s=first_commit - first.started,
        kill_to_exit_s=exited - killed,
        kill_to_group_gone_s=gone - killed,
    )
    committed_before = committed_epochs(checkpoint)
    restart_at = time.monotonic()
    second = EosProcess(pipeline_file, log=logs / f"{name}-2.log")
    try:
        recovered = second.first(r"\] recovery \(", timeout=300)
        committed = wait_committed(second, checkpoint, committed_before, timeout=300)
        ended = second.wait(600)
    finally:
        second.kill_group()
    if committed is None or ended is None:
        raise RuntimeError(f"the restarted run of {point} did not commit:\n{second.tail()}")
    row.update(
        exit_to_restart_s=restart_at - gone,
        kill_to_restart_s=restart_at - killed,
        restart_to_recovery_s=(recovered - restart_at) if recovered else None,
        restart_to_first_commit_s=committed - restart_at,
        restart_to_end_s=ended - restart_at,
        replay_lines=second.count(r"replay: "),
        restart_exit_code=second.proc.returncode,
    )
    row["committed_out"] = count_records(bench.bootstrap, out_topic)
    row["uncommitted_out"] = count_records(bench.bootstrap, out_topic, read_committed=False)
    row["expected_out"] = expected
    row["exactly_once"] = row["committed_out"] == expected
    delete_topics(bench.bootstrap, [out_topic, *eos_topics(name)])
    return row


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    source = bench.input(plan.recovery_events, plan.partitions)
    expected = expected_stateless_out(bench.bootstrap, source.topic)
    rows = []
    for point in plan.recovery_points:
        for run_no in range(plan.recovery_runs):
            bench.say(f"{point}: run {run_no + 1}/{plan.recovery_runs}: kill -9 at epoch {KILL_EPOCH}, restart ...")
            row = one_run(bench, point, expected, source.topic)
            row["run"] = run_no
            rows.append(row)
            bench.say(
                f"{point}: restart -> first commit {row['restart_to_first_commit_s']:.1f}s (cold start "
                f"{row['cold_start_to_first_commit_s']:.1f}s); output "
                + ("exactly once" if row["exactly_once"] else "WRONG")
            )
    return {"input": source.__dict__, "epoch_records": plan.recovery_epoch_records, "runs": rows}

"""A PySpark application that reports where its tasks ran; submitted by the cluster tests.

Each round (`--round NAME:SLEEP[:linger][:wait]`, one Spark job each, in order) squares `--rows` numbers
over `--partitions` partitions with mapInArrow (Python workers in the executors), and every task
records which executor ran it: the executor JVM's pid, id, host and working folder, found by
walking up from the Python worker to its CoarseGrainedExecutorBackend ancestor in /proc. The
driver prints one line `ROUND NAME <json>` per round with the result check and the task list,
flushed at once so a test can read it while later rounds run.

Files in `--out/NAME` (a folder the test, driver and executors share, as they run on one machine):
  started/p<partition>-a<attempt>-<pid>.json  written as a task begins (the test waits for these
                                              before killing a worker, so the kill lands mid-task)
  go                                          written by the test; a `wait` round starts after it
  job-done                                    written by the driver once the job has returned
  linger/p<partition>-<pid>.json              with --linger: written by a daemon thread the task
                                              started, after job-done appeared, plus 300 ms
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
LINGER_DELAY_S = 0.3


def _argument(cmdline: list[str], name: str) -> str | None:
    return cmdline[cmdline.index(name) + 1] if name in cmdline[:-1] else None


def executor_info() -> dict:
    """The executor JVM above this Python worker (worker <- pyspark.daemon <- executor)."""
    pid = os.getpid()
    for _ in range(6):
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            break
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if EXECUTOR_CLASS in cmdline:
            return {
                "executor_pid": pid,
                "executor_id": _argument(cmdline, "--executor-id"),
                "host": _argument(cmdline, "--hostname"),
                "executor_cwd": os.readlink(f"/proc/{pid}/cwd"),
            }
    return {"executor_pid": None, "executor_id": "driver", "host": None, "executor_cwd": None}


def _write_atomically(path: Path, text: str) -> None:
    """Readers poll for these files from other processes: they must never see one half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(path)


def _write_json(path: Path, document: dict) -> None:
    _write_atomically(path, json.dumps(document))


def linger(out: Path, partition: int, task_returned_at: float) -> None:
    """Runs in a daemon thread of the Python worker after its task returned: waits until the driver
    says the whole job is done, then does some work and records it."""
    done = out / "job-done"
    deadline = time.time() + 60
    while not done.exists() and time.time() < deadline:
        time.sleep(0.02)
    job_done_at = float(done.read_text()) if done.exists() else None
    time.sleep(LINGER_DELAY_S)
    work = sum(i * i for i in range(100_000))
    _write_json(
        out / "linger" / f"p{partition}-{os.getpid()}.json",
        {
            "partition": partition,
            "python_pid": os.getpid(),
            "task_returned_at": task_returned_at,
            "job_done_at": job_done_at,
            "written_at": time.time(),
            "work": work,
        },
    )


def make_probe(out: Path, sleep_s: float, with_linger: bool):
    def probe(batches: Iterator) -> Iterator:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        info = {"partition": partition, "attempt": attempt, "python_pid": os.getpid(), **executor_info()}
        jars = [entry for entry in sys.path if entry.endswith(".jar")]  # Spark's, unless eos's launcher ran
        marker = {**info, "at": time.time(), "jars_on_path": jars}
        _write_json(out / "started" / f"p{partition}-a{attempt}-{os.getpid()}.json", marker)
        time.sleep(sleep_s)
        for batch in batches:
            ids = batch.column("id")
            n = len(ids)
            yield pa.RecordBatch.from_pydict(
                {
                    "id": ids,
                    "square": pc.multiply(ids, ids),
                    "partition": [partition] * n,
                    "attempt": [attempt] * n,
                    "python_pid": [os.getpid()] * n,
                    "executor_pid": [info["executor_pid"]] * n,
                    "executor_id": [info["executor_id"]] * n,
                    "host": [info["host"]] * n,
                    "executor_cwd": [info["executor_cwd"]] * n,
                }
            )
        if with_linger:
            threading.Thread(target=linger, args=(out, partition, time.time()), daemon=True).start()

    return probe


SCHEMA = (
    "id long, square long, partition long, attempt long, python_pid long, executor_pid long, "
    "executor_id string, host string, executor_cwd string"
)


def wait_for_lingerers(out: Path, partitions: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = sorted((out / "linger").glob("*.json"))
        if len(files) >= partitions:
            break
        time.sleep(0.1)
    return [json.loads(path.read_text()) for path in sorted((out / "linger").glob("*.json"))]


def wait_for_go(out: Path, timeout: float = 300.0) -> None:
    """Holds a round back until the test writes `go` (it is then watching for the round's tasks)."""
    deadline = time.time() + timeout
    while not (out / "go").exists():
        if time.time() > deadline:
            raise TimeoutError(f"nobody wrote {out / 'go'} within {timeout:.0f} s")
        time.sleep(0.05)


def run_round(spark, out: Path, rows: int, partitions: int, sleep_s: float, with_linger: bool) -> dict:
    df = spark.range(0, rows, numPartitions=partitions)
    started = time.monotonic()
    result = df.mapInArrow(make_probe(out, sleep_s, with_linger), SCHEMA).collect()
    job_s = time.monotonic() - started
    # Atomically: a lingering thread that saw an empty job-done once failed to parse it (CI).
    _write_atomically(out / "job-done", repr(time.time()))
    lingerers = wait_for_lingerers(out, partitions) if with_linger else []
    ids = sorted(row.id for row in result)
    keys = ("partition", "attempt", "python_pid", "executor_pid", "executor_id", "host", "executor_cwd")
    tasks = sorted({tuple(getattr(row, key) for key in keys) for row in result})
    return {
        "rows": len(result),
        "ids_exact": ids == list(range(rows)),
        "squares_right": all(row.square == row.id * row.id for row in result),
        "tasks": [dict(zip(keys, task, strict=True)) for task in tasks],
        "lingerers": lingerers,
        "job_s": round(job_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--round",
        action="append",
        default=[],
        metavar="NAME:SLEEP[:linger][:wait]",
        help="one job: its output folder under --out, the seconds each task sleeps before its work, whether "
        "each task leaves a daemon thread behind, whether the job waits for a file `go` in its folder "
        "(repeatable; default probe:0)",
    )
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    started = time.monotonic()
    spark = SparkSession.builder.appName("eos-cluster-probe").getOrCreate()
    print(f"SESSION {json.dumps({'master': spark.sparkContext.master, 's': round(time.monotonic() - started, 3)})}")
    for spec in args.round or ["probe:0"]:
        name, sleep_s, *flags = spec.split(":")
        (args.out / name).mkdir(parents=True, exist_ok=True)
        if "wait" in flags:
            wait_for_go(args.out / name)
        report = run_round(spark, args.out / name, args.rows, args.partitions, float(sleep_s), "linger" in flags)
        print(f"ROUND {name} {json.dumps(report)}", flush=True)
    spark.stop()
    print(f"DONE {json.dumps({'app_s': round(time.monotonic() - started, 3)})}", flush=True)


if __name__ == "__main__":
    main()

"""A real Spark standalone cluster: master + two workers, real spark-submit, real SIGKILLs.

One cluster and one application for the whole module, because cold starts dominate the cost: the
application (tests/apps/cluster_probe.py) runs two rounds, each one Spark job over 4 partitions:

  probe  tasks record which executor ran them and leave a daemon thread behind in their Python
         worker (checked by test_tasks_run_on_both_workers and test_daemon_thread_outlives_its_task);
  kill   waits for the test's `go`, then tasks sleep 3 s; the test SIGKILLs worker 1 with its
         executor while a task runs there, and the job must still finish exactly, on worker 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from eos_ops.sparkcluster import QUICK_START_CONF, LocalSparkCluster, SparkSubmit, alive

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "apps" / "cluster_probe.py"
ROWS, PARTITIONS, KILL_ROUND_SLEEP_S = 4000, 4, 3.0
APP_TIMEOUT_S = 200.0
# Quick-starting JVMs (C1 only; JVM start-up dominates this module), and the first job waits for
# both executors even when starting them takes long on a loaded machine.
APP_CONF = {**QUICK_START_CONF, "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}


@dataclass
class ProbeRun:
    popen: SparkSubmit
    out: Path

    def round(self, name: str, timeout: float = APP_TIMEOUT_S) -> dict:
        """The report the application prints for round `name` (it keeps running the next rounds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.popen.output().splitlines():
                if line.startswith(f"ROUND {name} "):
                    return json.loads(line.split(" ", 2)[2])
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(
            f"no report for round {name} (exit code {self.popen.poll()}); stdout:\n{self.popen.output()}\n"
            f"log {self.popen.log_file}:\n{self.popen.log_tail()}"
        )

    def markers(self, name: str) -> list[dict]:
        return [json.loads(path.read_text()) for path in sorted((self.out / name / "started").glob("*.json"))]


@pytest.fixture(scope="module")
def cluster(spark_cluster: LocalSparkCluster) -> LocalSparkCluster:
    """The session's cluster (tests/cluster/conftest.py): one cold start for every cluster test."""
    return spark_cluster


@pytest.fixture(scope="module")
def probe(cluster: LocalSparkCluster, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    out = tmp_path_factory.mktemp("probe")
    rounds = ["--round", "probe:0.2:linger", "--round", f"kill:{KILL_ROUND_SLEEP_S}:wait"]
    args = ["--out", str(out), "--rows", str(ROWS), "--partitions", str(PARTITIONS), *rounds]
    popen = cluster.submit(APP, args, conf=APP_CONF)
    return ProbeRun(popen, out)


def worker_of(cluster: LocalSparkCluster, executor_cwd: str) -> int:
    """Which worker launched an executor: its working folder lies under that worker's --work-dir."""
    for index in range(cluster.workers):
        if Path(executor_cwd).is_relative_to(cluster.worker_dir(index)):
            return index
    raise AssertionError(f"executor folder {executor_cwd} is under no worker of {cluster.workdir}")


def assert_exact(report: dict) -> None:
    assert report["rows"] == ROWS
    assert report["ids_exact"], "some ids are missing or duplicated"
    assert report["squares_right"]


def test_master_and_two_workers_alive(cluster: LocalSparkCluster) -> None:
    status = cluster.status()
    assert status.running and status.master_url == cluster.master_url
    assert status.alive_workers == 2, status
    pids = [status.master_pid, *(worker.pid for worker in status.workers)]
    assert len(set(pids)) == 3 and all(pid and alive(pid) for pid in pids)
    # Each daemon leads its own process group, so killing one never signals another.
    assert all(os.getpgid(pid) == pid for pid in pids if pid)
    document = cluster.master_json()
    assert document is not None
    assert document["status"] == "ALIVE" and document["aliveworkers"] == 2 and document["cores"] == 2
    assert cluster.started_in is not None
    print(f"cluster started in {cluster.started_in:.1f} s")


def test_tasks_run_on_both_workers(cluster: LocalSparkCluster, probe: ProbeRun) -> None:
    report = probe.round("probe")
    assert_exact(report)
    tasks = report["tasks"]
    assert sorted(task["partition"] for task in tasks) == list(range(PARTITIONS))
    assert {worker_of(cluster, task["executor_cwd"]) for task in tasks} == {0, 1}
    assert {task["host"] for task in tasks} == {cluster.host}
    # The executor pids the tasks saw are the ones the cluster finds under its workers (the
    # application is still running: its next round waits for this module's `go`).
    executors = cluster.executors()
    for task in tasks:
        assert task["executor_pid"] in executors[worker_of(cluster, task["executor_cwd"])], (task, executors)
    # Every executor's Python worker ran through eos's launcher: Spark's jar is off its path.
    markers = probe.markers("probe")
    assert len(markers) >= PARTITIONS and all(marker["jars_on_path"] == [] for marker in markers), markers
    driver = cluster.driver_pids(probe.popen)
    assert driver and driver[0] == probe.popen.pid
    assert any("cluster_probe.py" in " ".join(_cmdline(pid)) for pid in driver[1:]), "no Python driver process"
    print(f"probe job: {report['job_s']:.1f} s over {len({t['executor_pid'] for t in tasks})} executors")


def test_daemon_thread_outlives_its_task(probe: ProbeRun) -> None:
    """eos commits a transaction from a daemon thread of the Python worker after the task that
    started it has returned: the thread must keep running in the executor's Python worker."""
    report = probe.round("probe")
    python_workers = {task["python_pid"]: task for task in report["tasks"]}
    lingerers = report["lingerers"]
    assert sorted(entry["partition"] for entry in lingerers) == list(range(PARTITIONS))
    for entry in lingerers:
        task = python_workers.get(entry["python_pid"])
        assert task is not None and task["executor_pid"], f"thread ran outside an executor's Python worker: {entry}"
        assert entry["task_returned_at"] <= entry["job_done_at"]
        # It waited for the whole job to be over, then 300 ms more, and still did its work.
        assert entry["written_at"] >= entry["job_done_at"] + 0.25
        assert entry["work"] == sum(i * i for i in range(100_000))


def test_the_clusters_secret_is_private(cluster: LocalSparkCluster, probe: ProbeRun) -> None:
    """Every process of the cluster and the application authenticates with the cluster's secret,
    and no command line shows it (the daemons read it from a file, executors get it from their
    worker's environment, drivers from submit.properties): only this user can read it."""
    probe.round("probe")  # the application runs, with its executors
    settings = dict(line.split("=", 1) for line in cluster.submit_properties.read_text().splitlines())
    secret = settings["spark.authenticate.secret"]
    assert settings["spark.authenticate"] == "true" and len(secret) >= 32
    for path in (cluster.submit_properties, cluster.properties_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(cluster.submit_properties.parent.stat().st_mode) == 0o700
    processes = [cluster.master_pid(), *(w.pid for w in cluster.status().workers)]
    processes += [pid for pids in cluster.executors().values() for pid in pids] + cluster.driver_pids(probe.popen)
    assert len(processes) >= 6, processes  # master, 2 workers, 2 executors, the driver's JVM and Python
    shown = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if secret in " ".join(_cmdline(pid))]
    assert shown == [], [" ".join(_cmdline(pid))[:300] for pid in shown]


def test_an_application_without_the_secret_is_refused(cluster: LocalSparkCluster, tmp_path: Path) -> None:
    """What another local user could do: submit to the master's port without the secret. The
    master refuses the connection, and the application never registers or runs a task."""
    app = tmp_path / "intruder.py"
    app.write_text(
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.appName('eos-intruder').getOrCreate()\n"
        "print('RAN', spark.range(4).count(), flush=True)\n"
    )
    command = cluster.submit_command(app, conf=QUICK_START_CONF)
    at = command.index("--properties-file")
    del command[at : at + 2]
    log = tmp_path / "intruder.log"
    with open(log, "wb") as out:
        intruder = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=cluster.environment(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + APP_TIMEOUT_S
        while "Failed to connect to master" not in log.read_text(errors="replace"):
            assert intruder.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the application neither failed to connect nor ran"
            document = cluster.master_json() or {}
            apps = document.get("activeapps", []) + document.get("completedapps", [])
            assert "eos-intruder" not in [a.get("name") for a in apps], "the master let it in"
            time.sleep(0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(intruder.pid, signal.SIGKILL)
        intruder.wait()
    assert "RAN" not in log.read_text(errors="replace")
    assert "maybe your client does not have SASL enabled" in cluster.log_file("master").read_text(errors="replace")


def test_kill_worker_mid_job(cluster: LocalSparkCluster, probe: ProbeRun) -> None:
    (probe.out / "kill" / "go").write_text("go")
    deadline = time.monotonic() + APP_TIMEOUT_S
    victim = None
    while victim is None and time.monotonic() < deadline and probe.popen.poll() is None:
        on_worker_1 = [m for m in probe.markers("kill") if worker_of(cluster, m["executor_cwd"]) == 1]
        victim = on_worker_1[0] if on_worker_1 else None
        time.sleep(0.05)
    assert victim is not None, f"no task of the kill round started on worker 1; log:\n{probe.popen.log_tail()}"
    assert time.time() - victim["at"] < KILL_ROUND_SLEEP_S - 0.5, "the task had nearly finished before the kill"

    killed_at = time.monotonic()
    killed = cluster.kill_worker(1)
    assert victim["executor_pid"] in killed and victim["python_pid"] in killed
    assert not any(alive(pid) for pid in killed)
    while cluster.status().workers[1].state == "ALIVE":
        assert time.monotonic() - killed_at < 90, "the master still reports the killed worker ALIVE"
        time.sleep(0.05)
    print(f"master noticed the dead worker after {time.monotonic() - killed_at:.2f} s")

    report = probe.round("kill")
    assert_exact(report)
    assert {worker_of(cluster, task["executor_cwd"]) for task in report["tasks"]} == {0}
    rerun = [task for task in report["tasks"] if task["partition"] == victim["partition"]]
    assert rerun and rerun[0]["attempt"] > victim["attempt"], "the killed task was not re-run"
    probe.popen.finish(APP_TIMEOUT_S)
    print(f"kill round: job {report['job_s']:.1f} s, finished {time.monotonic() - killed_at:.1f} s after the kill")

    restarted_at = time.monotonic()
    pid = cluster.start_worker(1)
    assert alive(pid) and cluster.status().alive_workers == 2
    print(f"worker 1 back in {time.monotonic() - restarted_at:.1f} s")


def test_stop_leaves_no_process(cluster: LocalSparkCluster) -> None:
    status = cluster.status()
    pids = [status.master_pid, *(worker.pid for worker in status.workers)]
    executors = [pid for pids in cluster.executors().values() for pid in pids]
    assert cluster.stop() is True
    assert not any(alive(pid) for pid in [*pids, *executors] if pid)
    assert not any(cluster.executors().values())
    assert cluster.status().running is False
    assert cluster.stop() is False, "a second stop found something to stop"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []

"""A real Spark standalone cluster on this machine: one master and N workers on loopback.

Why: `local[N]` runs every task inside the driver's JVM, so it never shows what a cluster does
to eos: executors in other JVMs with their own Python workers, an executor dying with its worker
in the middle of a stage, lost tasks re-run on another executor. The PyPI wheel of PySpark
carries all of Spark (`jars/`, `bin/spark-class`, `bin/spark-submit`), so a standalone cluster
needs nothing beyond Java 17: SPARK_HOME is simply the installed `pyspark` package (its mirror
without pyspark.zip, eos.sparksession.compiled_spark_home, when the cluster runs this interpreter).

Layout of a cluster's folder (`workdir`):

    cluster.json          ports and sizes, so `eos spark-cluster stop|status` find a running cluster
    conf/                 (mode 0700) its files mode 0600, for they hold the cluster's secret:
      spark-defaults.conf master and worker settings (--properties-file)
      submit.properties   what an application needs to be let in (spark-submit --properties-file)
    run/master.pid, run/worker-N.pid
    logs/master.log, logs/worker-N.log
    worker-N/             the worker's --work-dir: one folder per application and executor,
                          holding each executor's stdout and stderr
    apps/                 stdout (.out) and log (.log) of each `submit`

Every process binds to `host` (127.0.0.1): SPARK_LOCAL_IP makes the web UIs and block managers
bind there, SPARK_LOCAL_HOSTNAME makes executors advertise it instead of the machine's name.

Who may use it: loopback is open to every user of the machine, and a standalone master runs any
application it is sent, as the cluster's user. So every process of the cluster and every driver
authenticates (`spark.authenticate`) with a secret made at each cold start, which is never on a
command line: the daemons read it from conf/spark-defaults.conf, the workers hand it to their
executors in the environment (Spark's own way), and `submit` gives drivers conf/submit.properties.
A driver without it is refused. The web UIs (read-only here: killing applications and
decommissioning workers from them is off) still answer anyone on loopback.

How executors find Python: the driver tells them. `submit` sets `spark.pyspark.python` (and
PYSPARK_PYTHON in every process's environment) to this interpreter, `sys.executable`, through
eos's launcher that takes Spark's jar off its path (eos.sparksession.python_launcher): master,
workers and driver share the machine, so the venv's path is valid for every executor. A real
multi-host deployment cannot rely on that path. Either ship the environment with the job
(`venv-pack -o env.tar.gz`, then `spark-submit --archives env.tar.gz#environment
--conf spark.pyspark.python=./environment/bin/python`: each executor unpacks it into its working
folder), or install the same venv at the same path on every host and point
`spark.pyspark.python` at it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home
from eos.sparksession import local_python, pyspark_package, write_private_properties
from eos_ops import jvm
from eos_ops.jvm import alive, port_is_free, stat_fields

Progress = Callable[[str], None]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# Master and worker settings, written to conf/spark-defaults.conf and passed with --properties-file.
DAEMON_SETTINGS = {
    # Every connection to a daemon, executor or driver authenticates with the cluster's secret
    # (written beside these settings by _write_properties, never on a command line).
    "spark.authenticate": "true",
    # The UIs answer anyone on loopback: no killing applications or decommissioning workers there.
    "spark.ui.killEnabled": "false",
    "spark.master.ui.decommission.allow.mode": "DENY",
    # Applications are submitted in client mode; the REST submission server would take the fixed
    # port 6066 (and collide between two clusters) for nothing.
    "spark.master.rest.enabled": "false",
    # A taken port fails the daemon (and start() picks others) instead of Spark silently binding
    # port+1, which would leave cluster.json and the master URL wrong.
    "spark.port.maxRetries": "0",
    # Not set: spark.worker.timeout (60 s). A worker whose process dies is noticed within a second
    # (its connection drops: measured 0.2-0.5 s); the timeout only bounds how long a hung worker
    # with an open connection counts as alive, and a shorter one risks declaring a worker dead
    # during a long stall on a loaded machine, which would fail healthy tests.
}
PORT_ATTEMPTS = 3

# JVM options of the master and workers: control-plane processes with little work, so the C1
# compiler alone and the serial collector suffice. Measured on a loaded 2-core machine, they
# cut a cold start of master + 2 workers from 24-38 s to 11-16 s (less CPU spent compiling).
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# The same for the driver and executors of short applications such as tests, where JVM start-up
# dominates: measured with tests/apps/cluster_probe.py on a loaded 2-core machine, spark-submit
# to the end of the first (cold) job took 80-88 s instead of 120-169 s. Not a default of
# `submit`: long-running pipelines want the optimizing compiler.
QUICK_START_CONF = {
    "spark.driver.extraJavaOptions": DAEMON_JAVA_OPTS,
    "spark.executor.extraJavaOptions": DAEMON_JAVA_OPTS,
}


def _quiet(_: str) -> None:
    pass


def default_workdir() -> Path:
    return eos_home() / "spark-cluster"


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Spark, Java and ports
# ---------------------------------------------------------------------------------------------


def spark_home() -> Path:
    """The installed `pyspark` package: the PyPI wheel is a complete Spark distribution."""
    home = pyspark_package()
    for needed in ("bin/spark-class", "bin/spark-submit", "jars"):
        if not (home / needed).exists():
            raise EnvironmentProblem(
                f"{home} has no {needed}: this pyspark installation does not carry Spark itself.",
                hint="install PySpark from PyPI (`pip install 'pyspark>=4.3'`), which bundles Spark",
            )
    return home


def check_java() -> None:
    """Spark 4 needs Java 17 or later; say so before three JVMs fail to start."""
    jvm.find_java("a Spark cluster")


class PortTaken(EnvironmentProblem):
    """A daemon could not bind its port: another process took it after it was chosen."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


# ---------------------------------------------------------------------------------------------
# Processes, read from /proc
# ---------------------------------------------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid), None if the process is gone."""
    fields = stat_fields(pid)
    return (fields[0], int(fields[1])) if fields else None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    return children


def descendants(pid: int, children: Mapping[int, list[int]] | None = None) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...)."""
    tree = _children() if children is None else children
    found: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# ---------------------------------------------------------------------------------------------
# spark-submit
# ---------------------------------------------------------------------------------------------


class SparkSubmit(subprocess.Popen):
    """A running `spark-submit` (client mode: this process is the driver's JVM; the application's
    Python runs as its child). Its stdout goes to `out_file`, its stderr (Spark's log) to `log_file`."""

    out_file: Path
    log_file: Path
    command: list[str]

    def output(self) -> str:
        return self.out_file.read_text(errors="replace") if self.out_file.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_file, lines)

    def finish(self, timeout: float) -> str:
        """Waits for the application; returns its stdout, or raises with the log's tail if it failed."""
        try:
            code = self.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.wait()
            raise EnvironmentProblem(
                f"spark-submit did not finish within {timeout:.0f} s (killed). Last lines of {self.log_file}:\n"
                + self.log_tail()
            ) from None
        if code != 0:
            raise EnvironmentProblem(
                f"spark-submit exited with code {code}. Last lines of {self.log_file}:\n{self.log_tail()}"
            )
        return self.output()


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerStatus:
    index: int
    pid: int | None
    port: int
    state: str  # as the master reports it: ALIVE, DEAD, ... or "unknown to the master"
    executors: list[int]
    log_file: Path


@dataclass
class ClusterStatus:
    running: bool
    master_url: str
    master_pid: int | None
    webui: str
    workers: list[WorkerStatus] = field(default_factory=list)
    applications: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def alive_workers(self) -> int:
        return sum(1 for worker in self.workers if worker.state == "ALIVE" and worker.pid is not None)


class LocalSparkCluster:
    """A Spark standalone master and `workers` workers on `host`, identified by their folder.

    Every daemon runs in its own process group with its own log; executors are started by the
    workers (in the worker's process group, with their working folder under the worker's
    --work-dir), each with a Python daemon in a group of its own. `stop` finds them all.
    """

    def __init__(
        self,
        workdir: Path | str | None = None,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        host: str = "127.0.0.1",
        daemon_memory: str = "256m",
        python: str | None = None,
    ):
        self.workdir = Path(workdir).expanduser().resolve() if workdir else default_workdir()
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.host = host
        self.daemon_memory = daemon_memory
        # Not resolved: a venv's bin/python is a symlink, and resolving it would leave the venv.
        self.python = python or sys.executable
        self.started_in: float | None = None  # seconds the last cold start took
        self._procs: dict[str, subprocess.Popen] = {}
        self._submissions: list[SparkSubmit] = []
        self._state: dict = self._read_state()

    # -- files and state ---------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.workdir / "cluster.json"

    @property
    def properties_file(self) -> Path:
        return self.workdir / "conf" / "spark-defaults.conf"

    @property
    def submit_properties(self) -> Path:
        """What a driver needs to be let in (spark.authenticate and the secret), mode 0600."""
        return self.workdir / "conf" / "submit.properties"

    def log_file(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.workdir / "run" / f"{name}.pid"

    def worker_dir(self, index: int) -> Path:
        return self.workdir / f"worker-{index}"

    def _read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(self._state, indent=2))

    @property
    def master_port(self) -> int:
        return int(self._state.get("master_port", 0))

    @property
    def master_webui_port(self) -> int:
        return int(self._state.get("master_webui_port", 0))

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def webui(self) -> str:
        return f"http://{self.host}:{self.master_webui_port}"

    def _worker_ports(self) -> list[dict]:
        return list(self._state.get("workers", []))

    def environment(self) -> dict[str, str]:
        """The environment every process of the cluster (and every driver) runs with."""
        env = dict(os.environ)
        env.pop("SPARK_CONF_DIR", None)  # this cluster's settings come from its own properties file
        env.update(
            # Every process here runs this machine's interpreter: the mirror without pyspark.zip
            # spares each Python worker and planner compiling PySpark from the zip (~0.5 s).
            SPARK_HOME=str(self._local_python[0] or spark_home()),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOCAL_HOSTNAME=self.host,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_DAEMON_JAVA_OPTS=f"{DAEMON_JAVA_OPTS} {os.environ.get('SPARK_DAEMON_JAVA_OPTS', '')}".strip(),
            PYSPARK_PYTHON=self.worker_python,
            PYSPARK_DRIVER_PYTHON=self.python,
        )
        return env

    @functools.cached_property
    def _local_python(self) -> tuple[Path | None, str]:
        mirror, program = local_python(self.python)
        return mirror, program or self.python

    @property
    def worker_python(self) -> str:
        """What the Python processes Spark starts run: this interpreter, through the launcher that
        takes Spark's jar off their path when the cluster runs from the mirror (both spare every
        such process work, eos.sparksession)."""
        return self._local_python[1]

    # -- processes ---------------------------------------------------------------------------
    def _pid(self, name: str, java_class: str) -> int | None:
        """PID of this cluster's daemon `name` if it runs (guards against PID reuse)."""
        try:
            pid = int(self.pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None
        cmdline = _cmdline(pid)
        if alive(pid) and java_class in cmdline and str(self.properties_file) in cmdline:
            return pid
        return None

    def master_pid(self) -> int | None:
        return self._pid("master", MASTER_CLASS)

    def worker_pid(self, index: int) -> int | None:
        return self._pid(f"worker-{index}", WORKER_CLASS)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        """Starts a daemon via spark-class in a new session (its own process group; it outlives the
        command that started it and ignores the terminal's Ctrl-C)."""
        log_file = self.log_file(name)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file(name).parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(spark_home() / "bin" / "spark-class"), *args, "--properties-file", str(self.properties_file)]
        with open(log_file, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env=self.environment(), start_new_session=True,
            )  # fmt: skip
        # spark-class execs the JVM, so this pid becomes the daemon's own.
        self.pid_file(name).write_text(str(proc.pid))
        self._procs[name] = proc
        return proc

    def _check_started(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is not None:
            self.pid_file(name).unlink(missing_ok=True)
            last_run = self.log_file(name).read_text(errors="replace").rsplit("\n=== ", 1)[-1]
            if re.search(r"Address already in use|could not bind|BindException", last_run):
                raise PortTaken(name, f"the Spark {name} could not bind its port:\n{tail(self.log_file(name), 10)}")
            raise EnvironmentProblem(
                f"the Spark {name} exited with code {proc.returncode} during start-up. "
                f"Last lines of {self.log_file(name)}:\n{tail(self.log_file(name))}"
            )

    def _write_properties(self) -> None:
        """The daemons' settings and the drivers', with a new secret: files only this user reads."""
        conf = self.properties_file.parent
        conf.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf.chmod(0o700)
        auth = {"spark.authenticate": "true", "spark.authenticate.secret": secrets.token_hex(32)}
        write_private_properties(self.properties_file, {**DAEMON_SETTINGS, **auth})
        write_private_properties(self.submit_properties, auth)

    # -- the master's view -------------------------------------------------------------------
    def master_json(self, timeout: float = 2.0) -> dict | None:
        """The master's /json/ document (workers, their state, applications), or None if it does not answer."""
        if not self.master_webui_port:
            return None
        try:
            with urllib.request.urlopen(f"{self.webui}/json/", timeout=timeout) as response:
                return json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def _worker_states(self, document: dict | None) -> dict[int, str]:
        """Worker index -> state the master reports for it. A restarted worker is a new entry on the
        same port while the old one stays listed as DEAD, so ALIVE wins."""
        states: dict[int, str] = {}
        by_port = {entry["port"]: index for index, entry in enumerate(self._worker_ports())}
        for entry in (document or {}).get("workers", []):
            index = by_port.get(entry.get("port"))
            if index is not None and entry.get("host") == self.host and states.get(index) != "ALIVE":
                states[index] = entry.get("state", "?")
        return states

    def wait_for_workers(self, indices: Sequence[int], timeout: float = 120.0) -> None:
        """Until the master reports every worker in `indices` ALIVE."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_started("master")
            for index in indices:
                self._check_started(f"worker-{index}")
            states = self._worker_states(self.master_json())
            if all(states.get(index) == "ALIVE" for index in indices):
                return
            time.sleep(0.2)
        missing = [index for index in indices if self._worker_states(self.master_json()).get(index) != "ALIVE"]
        logs = "\n".join(
            f"--- {self.log_file(f'worker-{index}')}:\n{tail(self.log_file(f'worker-{index}'), 15)}"
            for index in missing
        )
        raise EnvironmentProblem(
            f"Spark workers {missing} did not register with the master {self.master_url} within {timeout:.0f} s.\n"
            f"{logs}\n--- {self.log_file('master')}:\n{tail(self.log_file('master'), 15)}"
        )

    # -- start -------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0, progress: Progress = _quiet) -> ClusterStatus:
        """Starts the master and the workers (idempotent: running ones are kept) and waits until the
        master reports every worker ALIVE."""
        started = time.monotonic()
        cold = self.master_pid() is None
        if cold:
            check_java()
            try:
                self._cold_start(timeout, progress)
            except BaseException:
                self.stop()  # a half-started cluster is no use to anyone; its logs stay
                raise
        else:
            recorded = len(self._worker_ports())
            if recorded != self.workers:
                raise EnvironmentProblem(
                    f"the Spark cluster in {self.workdir} runs with {recorded} workers, not {self.workers}.",
                    hint=f"stop it first: `eos spark-cluster stop --dir {self.workdir}`",
                )
            progress(f"Spark master already running at {self.master_url} (pid {self.master_pid()}).")
            missing = [index for index in range(self.workers) if self.worker_pid(index) is None]
            self._start_workers(missing, timeout, progress)
            cold = bool(missing)
        self.wait_for_workers(range(self.workers), timeout)
        elapsed = time.monotonic() - started
        if cold:
            self.started_in = elapsed
        status = self.status()
        status.details.append(f"ready in {elapsed:.1f} s")
        progress(
            f"Spark cluster ready at {self.master_url} ({self.workers} workers x {self.cores_per_worker} core, "
            f"{self.memory_per_worker}; master UI {self.webui}) in {elapsed:.1f} s."
        )
        return status

    def _cold_start(self, timeout: float, progress: Progress) -> None:
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_master(timeout, progress)
                break
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                progress("The Spark master's port was taken meanwhile; trying other ports.")
        self._start_workers(range(self.workers), timeout, progress)

    def _start_master(self, timeout: float, progress: Progress) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port, webui_port, *worker_ports = jvm.free_ports(2 + 2 * self.workers, self.host)
        self._state = {
            "host": self.host,
            "master_port": port,
            "master_webui_port": webui_port,
            "cores_per_worker": self.cores_per_worker,
            "memory_per_worker": self.memory_per_worker,
            "workers": [
                {"port": worker_ports[2 * i], "webui_port": worker_ports[2 * i + 1]} for i in range(self.workers)
            ],
        }
        self._write_state()
        self._write_properties()
        for index in range(self.workers):
            self.pid_file(f"worker-{index}").unlink(missing_ok=True)
        proc = self._spawn(
            "master",
            [MASTER_CLASS, "--host", self.host, "--port", str(port), "--webui-port", str(webui_port)],
        )
        progress(f"Starting the Spark master (pid {proc.pid}) at {self.master_url}, UI {self.webui} ...")
        # Workers that find no master wait 5-15 s before retrying, so they start only once it leads.
        # (Its JSON, not its RPC port, is polled: every probe of the port is a "disassociated" log line.)
        deadline = time.monotonic() + timeout
        while (self.master_json() or {}).get("status") != "ALIVE":
            self._check_started("master")
            if time.monotonic() > deadline:
                self.stop()
                raise EnvironmentProblem(
                    f"the Spark master did not answer at {self.master_url} within {timeout:.0f} s. "
                    f"Last lines of {self.log_file('master')}:\n{tail(self.log_file('master'))}"
                )
            time.sleep(0.1)

    def _start_workers(self, indices: Sequence[int], timeout: float, progress: Progress) -> None:
        """Starts workers and waits until they are ALIVE; one whose port was taken meanwhile is
        started again on other ports."""
        for index in indices:
            self._start_worker(index, progress)
        for attempt in range(PORT_ATTEMPTS):
            try:
                self.wait_for_workers(indices, timeout)
                return
            except PortTaken as taken:
                if attempt == PORT_ATTEMPTS - 1 or not taken.name.startswith("worker-"):
                    raise
                progress(f"The port of Spark {taken.name} was taken meanwhile; trying other ports.")
                self._start_worker(int(taken.name.split("-")[1]), progress, fresh_ports=True)

    def _start_worker(self, index: int, progress: Progress, fresh_ports: bool = False) -> None:
        ports = self._worker_ports()[index]
        taken = {self.master_port, self.master_webui_port} | {p for w in self._worker_ports() for p in w.values()}
        for key in ("port", "webui_port"):
            if fresh_ports or not port_is_free(self.host, ports[key]):
                ports[key] = jvm.free_ports(1, self.host, avoid=taken)[0]
                taken.add(ports[key])
        self._state["workers"][index] = ports
        self._write_state()
        work = self.worker_dir(index)
        work.mkdir(parents=True, exist_ok=True)
        proc = self._spawn(
            f"worker-{index}",
            [
                WORKER_CLASS, self.master_url,
                "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
                "--work-dir", str(work), "--host", self.host,
                "--port", str(ports["port"]), "--webui-port", str(ports["webui_port"]),
            ],
        )  # fmt: skip
        progress(f"Starting Spark worker {index} (pid {proc.pid}, port {ports['port']}, work dir {work}) ...")

    def start_worker(self, index: int, timeout: float = 120.0, progress: Progress = _quiet) -> int:
        """(Re)starts worker `index` and waits until the master reports it ALIVE; returns its pid."""
        self._require_master()
        if self.worker_pid(index) is None:
            self._start_workers([index], timeout, progress)
        self.wait_for_workers([index], timeout)
        pid = self.worker_pid(index)
        assert pid is not None
        return pid

    def _require_master(self) -> None:
        if self.master_pid() is None:
            raise EnvironmentProblem(
                f"no Spark master runs for {self.workdir}.",
                hint=f"start the cluster: `eos spark-cluster start --dir {self.workdir}`",
            )

    # -- executors and faults ----------------------------------------------------------------
    def executors(self) -> dict[int, list[int]]:
        """Worker index -> pids of the executor JVMs it launched (children of the worker, or any
        executor whose working folder is under the worker's --work-dir, e.g. orphaned ones)."""
        found: dict[int, list[int]] = {index: [] for index in range(len(self._worker_ports()))}
        workers = {self.worker_pid(index): index for index in found}
        for pid in _pids():
            if EXECUTOR_CLASS not in _cmdline(pid) or not alive(pid):
                continue
            stat, cwd = _stat(pid), _cwd(pid)
            for index in found:
                under = cwd is not None and cwd.is_relative_to(self.worker_dir(index))
                if under or (stat is not None and workers.get(stat[1]) == index):
                    found[index].append(pid)
                    break
        return found

    def kill_worker(self, index: int, timeout: float = 30.0) -> list[int]:
        """SIGKILLs worker `index`, the executor JVMs it launched and their Python workers, the way a
        machine failure would. Returns the killed pids once they are all gone."""
        pid = self.worker_pid(index)
        if pid is None:
            raise EnvironmentProblem(f"Spark worker {index} of {self.workdir} is not running.")
        executors = self.executors().get(index, [])
        tree = _children()
        # The worker first: a worker that outlived its executors would report them lost and relaunch.
        victims = [pid, *executors, *(child for executor in executors for child in descendants(executor, tree))]
        _signal_all(victims, signal.SIGKILL)
        self._reap(f"worker-{index}")
        left = jvm.wait_gone(victims, timeout)
        if left:
            raise EnvironmentProblem(f"processes {left} of Spark worker {index} survived SIGKILL for {timeout:.0f} s")
        self.pid_file(f"worker-{index}").unlink(missing_ok=True)
        return victims

    def _reap(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    # -- applications ------------------------------------------------------------------------
    def submit_conf(self, conf: Mapping[str, str] | None = None) -> dict[str, str]:
        """The settings `submit` passes: small JVMs, no UI, this interpreter everywhere, and a first
        stage that waits for every executor (so work is spread over all workers from the start)."""
        cores = self.cores_per_worker * len(self._worker_ports() or range(self.workers))
        settings = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.driver.memory": "512m",
            "spark.executor.memory": "512m",
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.cores.max": str(cores),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "30s",
            "spark.pyspark.python": self.worker_python,
            "spark.pyspark.driver.python": self.python,
        }
        settings.update(conf or {})
        return settings

    def submit_command(
        self, app_file: Path | str, args: Sequence[str] = (), conf: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> list[str]:  # fmt: skip
        """The spark-submit command line `submit` runs: the cluster's secret comes from its
        submit.properties file (--load-spark-defaults: spark-defaults.conf is read as well)."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url, "--deploy-mode", "client"]
        cmd += ["--properties-file", str(self.submit_properties), "--load-spark-defaults"]
        for key, value in self.submit_conf(conf).items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, *extra, str(app_file), *args]

    def submit(
        self,
        app_file: Path | str,
        args: Sequence[str] = (),
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> SparkSubmit:
        """Runs `spark-submit` of a Python application against this cluster, in its own process group;
        returns at once. The driver's stdout goes to apps/NAME-N.out, Spark's log to apps/NAME-N.log."""
        self._require_master()
        if not self.submit_properties.exists():
            raise EnvironmentProblem(
                f"the Spark cluster in {self.workdir} has no {self.submit_properties.name}: it was started by an eos "
                "that did not authenticate its applications",
                hint=f"restart it: `eos spark-cluster stop --dir {self.workdir}`, then `... start`",
            )
        apps = self.workdir / "apps"
        apps.mkdir(parents=True, exist_ok=True)
        stem = f"{Path(app_file).stem}-{time.strftime('%H%M%S')}-{len(self._submissions)}"
        cmd = self.submit_command(app_file, args, conf, extra)
        environment = {**self.environment(), **(env or {})}
        out_file, log_file = apps / f"{stem}.out", apps / f"{stem}.log"
        with open(out_file, "wb") as out, open(log_file, "wb") as log:
            log.write((" ".join(cmd) + "\n").encode())
            log.flush()
            proc = SparkSubmit(
                cmd, stdout=out, stderr=log, stdin=subprocess.DEVNULL, env=environment, start_new_session=True
            )
        proc.out_file, proc.log_file, proc.command = out_file, log_file, cmd
        self._submissions.append(proc)
        return proc

    @staticmethod
    def driver_pids(popen: subprocess.Popen) -> list[int]:
        """The driver's processes: the spark-submit JVM and everything below it (the application's Python)."""
        if popen.poll() is not None:
            return []
        # alive() drops zombies, such as the launcher subshell spark-class leaves behind when it execs.
        return [pid for pid in [popen.pid, *descendants(popen.pid)] if alive(pid)]

    # -- status and stop ---------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        master = self.master_pid()
        document = self.master_json() if master else None
        states = self._worker_states(document)
        executors = self.executors()
        status = ClusterStatus(master is not None and document is not None, self.master_url, master, self.webui)
        for index, ports in enumerate(self._worker_ports()):
            state = states.get(index, "unknown to the master")
            pid = self.worker_pid(index)
            status.workers.append(
                WorkerStatus(
                    index, pid, ports["port"], state, executors.get(index, []), self.log_file(f"worker-{index}")
                )
            )
        status.applications = [f"{app.get('id')} {app.get('name')}" for app in (document or {}).get("activeapps", [])]
        return status

    def _leftovers(self) -> list[int]:
        """Processes of this cluster not tracked by a pid file: executors and their Python daemons
        and workers whose working folder lies under a worker's --work-dir (e.g. orphaned by a killed
        worker). Only Spark's own: a user's shell that cd'ed there to read a log is left alone."""
        roots = [self.worker_dir(index) for index in range(len(self._worker_ports()))]
        found = []
        for pid in _pids():
            cwd = _cwd(pid)
            if pid == os.getpid() or cwd is None or not any(cwd.is_relative_to(root) for root in roots):
                continue
            cmdline = " ".join(_cmdline(pid))
            if EXECUTOR_CLASS in cmdline or "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
                found.append(pid)
        return found

    def kill_submissions(self) -> list[int]:
        """SIGKILLs every driver `submit` started that still runs (its whole process group), so an
        application a failed caller left behind does not keep the cluster's cores. Returns their pids."""
        running = [proc for proc in self._submissions if proc.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return [proc.pid for proc in running]

    def stop(self, timeout: float = 20.0, progress: Progress = _quiet) -> bool:
        """Stops drivers started by `submit`, the workers (which stop their executors), the master,
        and anything left under the workers' folders. Idempotent; False if nothing was running."""
        self.kill_submissions()
        workers = [pid for index in range(len(self._worker_ports())) if (pid := self.worker_pid(index))]
        master = self.master_pid()
        daemons = [*workers, *([master] if master else [])]
        executors = [pid for pids in self.executors().values() for pid in pids]
        tree = _children()
        everything = set(daemons) | set(executors) | {c for pid in daemons + executors for c in descendants(pid, tree)}
        everything |= set(self._leftovers())
        everything = {pid for pid in everything if alive(pid)}
        if not everything:
            self._forget_pids()
            progress(f"No Spark cluster running for {self.workdir}.")
            return False
        _signal_all(daemons, signal.SIGTERM)  # workers kill their executors on shutdown
        left = jvm.wait_gone(daemons, timeout)
        if left:
            progress(f"Spark daemons {left} did not stop within {timeout:.0f} s; killing them.")
        stragglers = {pid for pid in everything | set(self._leftovers()) if alive(pid)}
        _signal_all(stragglers, signal.SIGKILL)
        for name in list(self._procs):
            self._reap(name)
        left = jvm.wait_gone(stragglers, 10)
        if left:
            raise EnvironmentProblem(f"Spark processes {left} of {self.workdir} survived SIGKILL")
        self._forget_pids()
        progress(f"Spark cluster at {self.master_url} stopped ({len(everything)} processes).")
        return True

    def _forget_pids(self) -> None:
        for pid_file in (self.workdir / "run").glob("*.pid"):
            pid_file.unlink(missing_ok=True)
        self._procs.clear()

    def __enter__(self) -> LocalSparkCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

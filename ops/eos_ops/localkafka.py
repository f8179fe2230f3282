"""The embedded local broker: a single-node Apache Kafka (KRaft) on loopback.

No Docker needed: the broker's jars are resolved from Maven Central with the pom in
`ops/kafka/`, cached under $EOS_HOME/kafka/<hash of the pom>/libs, and the broker runs as
a background JVM with a small heap. `eos kafka start|stop|status` drives this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, ops_dir

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def kafka_ops_dir() -> Path:
    return ops_dir() / "kafka"


def kafka_version() -> str:
    """The Kafka version the pom pins (the one place it is written)."""
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", (kafka_ops_dir() / "pom.xml").read_text())
    return match.group(1) if match else "unknown"


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Java and the jar cache
# ---------------------------------------------------------------------------------------------


def find_java() -> str:
    """Path of a Java >= 17 executable, or a clear error."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise EnvironmentProblem(
            "Java was not found: the local Kafka broker needs Java 17 or later.",
            hint="install a JDK 17+ (e.g. `apt install openjdk-17-jre-headless`) or set JAVA_HOME",
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < 17:
        raise EnvironmentProblem(
            f"{java} is Java {major or '?'}; the local Kafka broker needs Java 17 or later.",
            hint="point JAVA_HOME at a JDK 17+",
        )
    return java


def jar_cache_dir() -> Path:
    pom = (kafka_ops_dir() / "pom.xml").read_bytes()
    return eos_home() / "kafka" / hashlib.sha256(pom).hexdigest()[:12]


def fetch_jars(progress: Progress = _quiet) -> Path:
    """Resolve the broker's jars from Maven Central once; returns the libs folder."""
    cache = jar_cache_dir()
    libs = cache / "libs"
    if (cache / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem(
            "Maven (mvn) was not found: it is needed once, to fetch the Kafka broker jars.",
            hint="install Maven (e.g. `apt install maven`)",
        )
    progress(f"Fetching Apache Kafka {kafka_version()} jars from Maven Central into {libs} (once) ...")
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
    cmd = [
        mvn, "-B", "-q", "-f", str(kafka_ops_dir() / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = (result.stdout + result.stderr).strip()
        offline = re.search(r"Could not (transfer|resolve)|UnknownHost|offline|Connection refused", output)
        raise EnvironmentProblem(
            "Maven could not fetch the Kafka broker jars"
            + (" (Maven Central unreachable: are you offline?)" if offline else "")
            + f".\n  command: {' '.join(cmd)}\n  last lines:\n"
            + "\n".join("    " + line for line in output.splitlines()[-15:]),
            hint="check network access to https://repo1.maven.org, or a Maven mirror in ~/.m2/settings.xml",
        )
    if libs.exists():
        shutil.rmtree(libs)
    staging.rename(libs)
    (cache / ".complete").write_text(kafka_version())
    jars = len(list(libs.glob("*.jar")))
    progress(f"Fetched {jars} jars in {time.monotonic() - started:.1f} s.")
    return libs


def java_classpath(progress: Progress = _quiet) -> str:
    return str(fetch_jars(progress) / "*")


# ---------------------------------------------------------------------------------------------
# The broker
# ---------------------------------------------------------------------------------------------


@dataclass
class BrokerStatus:
    running: bool
    bootstrap: str
    pid: int | None
    data_dir: Path
    log_file: Path
    answering: bool = False
    topics: int | None = None
    details: list[str] = field(default_factory=list)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port such that port+1 is free too (the controller listens there)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port < 65535 and port_is_free(host, port + 1):
            return port
    raise EnvironmentProblem("could not find two adjacent free TCP ports on loopback")


class LocalBroker:
    """One local KRaft broker+controller, identified by its data directory."""

    def __init__(
        self,
        port: int = 9092,
        data_dir: Path | str | None = None,
        heap: str = "512m",
        host: str = "127.0.0.1",
        controller_port: int | None = None,
    ):
        self.host = host
        self.port = port
        self.controller_port = controller_port or port + 1
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else eos_home() / f"broker-{port}"
        self.heap = heap

    # -- files ------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "kafka-logs"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    def _render_properties(self) -> None:
        template = string.Template((kafka_ops_dir() / "server.properties").read_text())
        self.properties_file.write_text(
            template.substitute(
                host=self.host, port=self.port, controller_port=self.controller_port, log_dir=self.log_dir
            )
        )

    # -- process ----------------------------------------------------------------------------
    def pid(self) -> int | None:
        """PID of this data directory's broker if it is alive (guards against PID reuse)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            return None
        if "kafka.Kafka" in cmdline and str(self.properties_file) in cmdline:
            return pid
        return None

    def answers(self, timeout: float = 2.0) -> int | None:
        """Number of topics if the broker answers a metadata request, else None."""
        from eos_connectors.kafka.clients import admin_client

        # log_level 0: "connection refused" while the broker boots is expected, not news.
        admin = admin_client({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=timeout)
        except Exception:
            return None
        return len(metadata.topics) if metadata.brokers else None

    def status(self) -> BrokerStatus:
        pid = self.pid()
        status = BrokerStatus(pid is not None, self.bootstrap, pid, self.data_dir, self.log_file)
        if pid is not None:
            status.topics = self.answers()
            status.answering = status.topics is not None
        return status

    def _format_storage(self, java: str, classpath: str) -> None:
        if (self.log_dir / "meta.properties").exists():
            return
        cluster_id = (
            subprocess.run(
                [java, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1:]
        )
        if not cluster_id:
            raise EnvironmentProblem("kafka.tools.StorageTool random-uuid printed nothing; is the jar cache intact?")
        result = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", "format", "--standalone",
             "-t", cluster_id[0], "-c", str(self.properties_file)],
            capture_output=True, text=True,
        )  # fmt: skip
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"formatting the broker storage in {self.log_dir} failed:\n{(result.stdout + result.stderr)[-2000:]}"
            )

    def start(self, timeout: float = 120.0, progress: Progress = _quiet) -> BrokerStatus:
        """Start the broker (idempotent) and wait until it answers a metadata request."""
        started = time.monotonic()
        if self.pid() is not None:
            if self.answers(timeout=10) is not None:
                progress(f"Kafka broker already running at {self.bootstrap} (pid {self.pid()}).")
                return self.status()
            raise EnvironmentProblem(
                f"a broker process (pid {self.pid()}) owns {self.data_dir} but does not answer at {self.bootstrap}.",
                hint=f"stop it with `eos kafka stop --data-dir {self.data_dir}`; its log is {self.log_file}",
            )
        for port in (self.port, self.controller_port):
            if not port_is_free(self.host, port):
                raise EnvironmentProblem(
                    f"port {port} on {self.host} is already in use by another process.",
                    hint="choose other ports with `eos kafka start --port N` (the controller uses N+1)",
                )
        java = find_java()
        classpath = java_classpath(progress)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._render_properties()
        self._format_storage(java, classpath)
        log4j = kafka_ops_dir() / "log4j2.yaml"
        cmd = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log4j}",
            "-cp", classpath, "kafka.Kafka", str(self.properties_file),
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            # A new session: the broker outlives this command and ignores the terminal's Ctrl-C.
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.data_dir, start_new_session=True,
            )  # fmt: skip
        self.pid_file.write_text(str(proc.pid))
        progress(f"Starting Kafka {kafka_version()} (pid {proc.pid}, heap {self.heap}, data {self.data_dir}) ...")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                self.pid_file.unlink(missing_ok=True)
                raise EnvironmentProblem(
                    f"the Kafka broker exited with code {code} during start-up. Last lines of {self.log_file}:\n"
                    + tail(self.log_file)
                )
            if self.answers(timeout=1) is not None:
                status = self.status()
                status.details.append(f"ready in {time.monotonic() - started:.1f} s")
                progress(f"Kafka broker ready at {self.bootstrap} in {time.monotonic() - started:.1f} s.")
                return status
            time.sleep(0.25)
        self.stop(kill=True)
        raise EnvironmentProblem(
            f"the Kafka broker did not answer at {self.bootstrap} within {timeout:.0f} s. "
            f"Last lines of {self.log_file}:\n{tail(self.log_file)}"
        )

    def stop(self, timeout: float = 60.0, kill: bool = False, progress: Progress = _quiet) -> bool:
        """Stop the broker: SIGTERM and a clean shutdown, or SIGKILL with kill=True.

        Returns False if it was not running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            progress(f"No Kafka broker running for {self.data_dir}.")
            return False
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(pid):
            time.sleep(0.1)
        if self._alive(pid):
            progress(f"The broker did not stop within {timeout:.0f} s; killing it.")
            os.kill(pid, signal.SIGKILL)
            while self._alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        progress(f"Kafka broker at {self.bootstrap} stopped.")
        return True

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie child (when this process started it) counts as gone.
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return False
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
        return True

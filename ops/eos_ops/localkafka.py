"""The embedded local broker: a single-node Apache Kafka (KRaft) on loopback.

No Docker needed: the broker's jars are resolved from Maven Central with the pom in
`ops/kafka/`, cached under $EOS_HOME/kafka/<hash of the pom>/libs, and the broker runs as
a background JVM with a small heap. `eos kafka start|stop|status` drives this module.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import string
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, ops_dir
from eos_ops import jvm
from eos_ops.jvm import port_is_free
from eos_ops.kafka_security import BrokerSecurity, listener_settings, write_argument_file

Progress = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    pass


def kafka_ops_dir() -> Path:
    return ops_dir() / "kafka"


def kafka_version() -> str:
    """The Kafka version the pom pins (the one place it is written)."""
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", (kafka_ops_dir() / "pom.xml").read_text())
    return match.group(1) if match else "unknown"


# JVM options for Kafka's short-lived command-line tools (StorageTool, TransactionsCommand, ...).
TOOL_JVM_OPTIONS = ("-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
# The broker's JVM: G1 with short pauses (a long GC pause looks like a dead broker to its peers).
BROKER_JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
# A cluster node is for fault-injection tests, not throughput: C1-only JIT spends far less CPU while
# three JVMs warm up on two cores (measured: ready in ~16 s instead of ~23 s on a loaded machine).
CLUSTER_JVM_OPTIONS = (*BROKER_JVM_OPTIONS, "-XX:TieredStopAtLevel=1")


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Java and the jar cache
# ---------------------------------------------------------------------------------------------


def find_java() -> str:
    """Path of a Java >= 17 executable, or a clear error."""
    return jvm.find_java("the local Kafka broker")


def jar_cache_dir() -> Path:
    return jvm.jar_cache_dir(kafka_ops_dir() / "pom.xml", eos_home() / "kafka")


def fetch_jars(progress: Progress = _quiet) -> Path:
    """Resolve the broker's jars from Maven Central once; returns the libs folder."""
    return jvm.fetch_jars(
        kafka_ops_dir() / "pom.xml", eos_home() / "kafka", f"Apache Kafka {kafka_version()}", progress
    )


def java_classpath(progress: Progress = _quiet) -> str:
    return str(fetch_jars(progress) / "*")


# ---------------------------------------------------------------------------------------------
# One Kafka process: what the single broker and every node of a cluster share
# ---------------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1", span: int = 2) -> int:
    """A free TCP port such that the `span` ports from it are all free: the single broker needs two
    (client, controller), a LocalCluster six. Outside the ephemeral range (see jvm.daemon_port_pool):
    a broker restarts on the same ports."""
    return jvm.free_port_run(span, host)


def kafka_uuid() -> str:
    """A random Kafka Uuid (cluster id, directory id) in Kafka's text form: 16 random bytes in URL-safe
    base64 without padding. Made here because `StorageTool random-uuid` costs a JVM start per id; like
    Kafka, ids starting with '-' are avoided, as command lines would read them as options."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, D, T when stopped, Z for a zombie), None if gone."""
    fields = jvm.stat_fields(pid)
    return fields[0] if fields else None


class KafkaNode:
    """One Kafka server process (KRaft broker+controller) on loopback, identified by its data directory.

    What the single local broker and each node of a LocalCluster share: rendering a properties template
    from ops/kafka, formatting the storage once, launching a background JVM, finding it again through its
    pid file (guarded against PID reuse), and signalling it: a clean stop, SIGKILL, SIGSTOP/SIGCONT."""

    def __init__(
        self,
        node_id: int,
        port: int,
        controller_port: int,
        data_dir: Path,
        heap: str,
        host: str = "127.0.0.1",
        template: str = "server.properties",
        jvm_options: tuple[str, ...] = BROKER_JVM_OPTIONS,
        security: BrokerSecurity | None = None,
    ):
        self.node_id = node_id
        self.host = host
        self.port = port
        self.controller_port = controller_port
        self.data_dir = data_dir
        self.heap = heap
        self.template = template
        self.jvm_options = jvm_options
        self.security = security  # None: PLAINTEXT, no authorizer (the default)

    @property
    def name(self) -> str:
        return f"Kafka node {self.node_id}"

    # -- files ------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def controller_endpoint(self) -> str:
        return f"{self.host}:{self.controller_port}"

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

    @property
    def format_arguments_file(self) -> Path:
        return self.data_dir / "format.args"

    def client_settings(self) -> dict[str, str]:
        """librdkafka settings that reach this node: its bootstrap and, if secured, the super user's credentials."""
        if self.security is None:
            return {"bootstrap.servers": self.bootstrap}
        return self.security.client_settings(self.bootstrap)

    def render_properties(self, **extra: object) -> None:
        """Fill the template's $placeholders; `extra` supplies the ones beyond this node's own. A secured
        node's settings follow the template's."""
        template = string.Template((kafka_ops_dir() / self.template).read_text())
        own = {"node_id": self.node_id, "host": self.host, "port": self.port, "controller_port": self.controller_port}
        listeners = listener_settings(self.host, self.port, self.controller_port, secure=self.security is not None)
        text = template.substitute(own, log_dir=self.log_dir, **listeners, **extra)
        if self.security is not None:
            text += self.security.server_properties()
        self.properties_file.write_text(text)

    def format_command(self, java: str, classpath: str, cluster_id: str, *quorum: str) -> list[str] | None:
        """The `StorageTool format` command that writes meta.properties and the bootstrap checkpoint, or
        None if this node is formatted already. `quorum` is `--standalone` for a lone broker and
        `--initial-controllers ...` for a node of a cluster. A small client-style JVM: C1 only and a
        serial GC start faster, and formatting does little work. A secured node's storage also gets the
        brokers' SCRAM credential (KIP-900), so the arguments go into a 0600 file that `java @file`
        reads (`ps` would show them otherwise); forget_format_arguments() deletes it."""
        if (self.log_dir / "meta.properties").exists():
            return None
        arguments = [*TOOL_JVM_OPTIONS, "-cp", classpath, "kafka.tools.StorageTool", "format",
                     "-t", cluster_id, "-c", str(self.properties_file), *quorum]  # fmt: skip
        if self.security is None:
            return [java, *arguments]
        arguments += ["--add-scram", self.security.scram_argument()]
        return [java, f"@{write_argument_file(self.format_arguments_file, arguments)}"]

    def forget_format_arguments(self) -> None:
        self.format_arguments_file.unlink(missing_ok=True)

    def format_failed(self, output: str) -> EnvironmentProblem:
        return EnvironmentProblem(
            f"formatting the storage of {self.name} in {self.log_dir} failed:\n{output[-2000:]}",
            hint=f"if its data is expendable, delete {self.data_dir} and start again",
        )

    def format_storage(self, java: str, classpath: str, cluster_id: str, *quorum: str) -> None:
        """Format this node's storage once (see format_command)."""
        cmd = self.format_command(java, classpath, cluster_id, *quorum)
        if cmd is None:
            return
        try:
            result = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            self.forget_format_arguments()
        if result.returncode != 0:
            raise self.format_failed(result.stdout + result.stderr)

    def check_ports_free(self, hint: str) -> None:
        for port in (self.port, self.controller_port):
            if not port_is_free(self.host, port):
                raise EnvironmentProblem(f"port {port} on {self.host} is already in use by another process.", hint=hint)

    # -- process ----------------------------------------------------------------------------
    def launch(self, java: str, classpath: str) -> subprocess.Popen:
        """Start the JVM in the background (rendered and formatted already); returns at once."""
        log4j = kafka_ops_dir() / "log4j2.yaml"
        # A secured node reads its passwords from its JAAS file: the command line holds only its path.
        jaas = [self.security.jvm_option()] if self.security is not None else []
        cmd = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", *self.jvm_options, *jaas,
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
        return proc

    def pid(self) -> int | None:
        """PID of this data directory's broker if it is alive (guards against PID reuse)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            return None
        if "kafka.Kafka" in cmdline and str(self.properties_file) in cmdline and jvm.alive(pid):
            return pid
        return None

    def state(self) -> str:
        """'stopped' (no process), 'paused' (SIGSTOP: alive but frozen) or 'running'."""
        pid = self.pid()
        if pid is None:
            return "stopped"
        return "paused" if _process_state(pid) in ("T", "t") else "running"

    def send_signal(self, sig: signal.Signals) -> int:
        pid = self.pid()
        if pid is None:
            raise EnvironmentProblem(
                f"{self.name} is not running (data directory {self.data_dir}): nothing to send {sig.name} to.",
                hint="start it first",
            )
        os.kill(pid, sig)
        return pid

    def pause(self) -> None:
        """SIGSTOP: the JVM freezes with its sockets open, like a long GC pause or a hung VM, not a crash."""
        pid = self.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _process_state(pid) not in ("T", "t") and time.monotonic() < deadline:
            time.sleep(0.02)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 60.0, kill: bool = False, progress: Progress = _quiet) -> bool:
        """Stop the process: SIGTERM and a clean shutdown, or SIGKILL with kill=True. A paused process
        is continued so that it can act on SIGTERM. Returns False if it was not running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            progress(f"No {self.name} running for {self.data_dir}.")
            return False
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        if not kill:
            os.kill(pid, signal.SIGCONT)
        self.wait_gone(pid, timeout, progress)
        progress(f"{self.name} at {self.bootstrap} stopped.")
        return True

    def wait_gone(self, pid: int, timeout: float, progress: Progress = _quiet) -> None:
        """Wait for `pid` to exit, SIGKILL it after `timeout`; then forget the pid file."""
        late = f"{self.name} did not stop within {timeout:.0f} s; killing it."
        jvm.wait_or_kill(pid, timeout, lambda: progress(late))
        self.pid_file.unlink(missing_ok=True)


def _wait_until(
    check: Callable[[], T | None],
    deadline: float,
    what: str,
    watch: Mapping[KafkaNode, subprocess.Popen] | None = None,
    interval: float = 0.25,
) -> T | None:
    """Poll `check` until it returns something other than None; None once `deadline` passes. A watched
    process that exits meanwhile is an error that quotes the end of its log."""
    while True:
        _raise_if_exited(watch or {}, what)
        result = check()
        if result is not None or time.monotonic() >= deadline:
            return result
        time.sleep(interval)


def _raise_if_exited(watch: Mapping[KafkaNode, subprocess.Popen], what: str) -> None:
    for node, proc in watch.items():
        code = proc.poll()
        if code is not None:
            node.pid_file.unlink(missing_ok=True)
            raise EnvironmentProblem(
                f"{node.name} exited with code {code} while {what}. Last lines of {node.log_file}:\n"
                + tail(node.log_file)
            )


def _metadata(settings: Mapping[str, str], timeout: float, topic: str | None = None):
    """Cluster metadata from any broker of `settings` (bootstrap.servers and, if secured, the super
    user's credentials), or None if none answers in time."""
    from eos_connectors.kafka.clients import admin_client

    # log_level 0: "connection refused" while a broker boots (or after a kill) is expected, not news.
    # socket.timeout.ms: a paused broker keeps its connections open and must not hold a request forever.
    timeout_ms = max(1000, int(timeout * 1000))
    admin = admin_client({**settings, "log_level": 0, "socket.timeout.ms": timeout_ms})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout)
    except Exception:
        return None
    return metadata if metadata.brokers else None


# ---------------------------------------------------------------------------------------------
# The single broker
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
    client_file: Path | None = None  # a secured broker's client settings (the super user's)


def _security(data_dir: Path, secure: bool | None, formatted: bool, what: str) -> BrokerSecurity | None:
    """The security of a data directory: fixed when it is first formatted (SASL_SSL with secure=True,
    else PLAINTEXT) and found again from its `security` folder later; secure=None means "as it is"."""
    security = BrokerSecurity(data_dir / "security")
    if security.exists():
        if secure is False:
            raise EnvironmentProblem(
                f"{data_dir} holds a secured {what} (SASL_SSL); it cannot be started without security.",
                hint=f"leave the option out, or use another --data-dir (or delete {data_dir})",
            )
        return security
    if secure and formatted:
        raise EnvironmentProblem(
            f"{data_dir} holds a {what} formatted without security (PLAINTEXT); it cannot be secured in place.",
            hint=f"use another --data-dir for a secured one (or delete {data_dir})",
        )
    return security if secure else None


class LocalBroker(KafkaNode):
    """One local KRaft broker+controller, identified by its data directory. secure=True: a new data
    directory is set up for SASL_SSL (SCRAM-SHA-512 over TLS) and the StandardAuthorizer
    (eos_ops.kafka_security); None: as the data directory was set up (PLAINTEXT if new)."""

    def __init__(
        self,
        port: int = 9092,
        data_dir: Path | str | None = None,
        heap: str = "512m",
        host: str = "127.0.0.1",
        controller_port: int | None = None,
        secure: bool | None = None,
    ):
        data_dir = Path(data_dir).expanduser().resolve() if data_dir else eos_home() / f"broker-{port}"
        formatted = (data_dir / "kafka-logs" / "meta.properties").exists()
        super().__init__(
            node_id=1,
            port=port,
            controller_port=controller_port or port + 1,
            data_dir=data_dir,
            heap=heap,
            host=host,
            security=_security(data_dir, secure, formatted, "broker"),
        )

    @property
    def name(self) -> str:
        return "Kafka broker"

    def answers(self, timeout: float = 2.0) -> int | None:
        """Number of topics if the broker answers a metadata request, else None."""
        metadata = _metadata(self.client_settings(), timeout)
        return None if metadata is None else len(metadata.topics)

    def status(self) -> BrokerStatus:
        pid = self.pid()
        status = BrokerStatus(pid is not None, self.bootstrap, pid, self.data_dir, self.log_file)
        status.client_file = self.security.client_file if self.security is not None else None
        if pid is not None:
            status.topics = self.answers()
            status.answering = status.topics is not None
        return status

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
        self.check_ports_free(hint="choose other ports with `eos kafka start --port N` (the controller uses N+1)")
        java = find_java()
        classpath = java_classpath(progress)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self.security.make()
            self.security.write_client_file(self.bootstrap)
        self.render_properties()
        self.format_storage(java, classpath, kafka_uuid(), "--standalone")
        proc = self.launch(java, classpath)
        secured = ", SASL_SSL" if self.security is not None else ""
        progress(
            f"Starting Kafka {kafka_version()} (pid {proc.pid}, heap {self.heap}{secured}, data {self.data_dir}) ..."
        )
        what = "starting up"
        if _wait_until(lambda: self.answers(timeout=1), started + timeout, what, {self: proc}) is not None:
            status = self.status()
            status.details.append(f"ready in {time.monotonic() - started:.1f} s")
            progress(f"Kafka broker ready at {self.bootstrap} in {time.monotonic() - started:.1f} s.")
            return status
        self.stop(kill=True)
        raise EnvironmentProblem(
            f"the Kafka broker did not answer at {self.bootstrap} within {timeout:.0f} s. "
            f"Last lines of {self.log_file}:\n{tail(self.log_file)}"
        )


def client_port(properties_file: Path) -> int | None:
    """The client port a node was rendered with: its first listener's (None if it was never rendered)."""
    try:
        text = properties_file.read_text()
    except OSError:
        return None
    match = re.search(r"^listeners=[A-Z_]+://[^,\s]*:(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def running_here(home: Path | None = None) -> list[LocalBroker | LocalCluster]:
    """Every local broker and cluster eos started under $EOS_HOME (`broker-PORT`, `cluster-PORT`),
    on whatever port, that runs now. One started with --data-dir elsewhere is found only there."""
    home = home or eos_home()
    found: list[LocalBroker | LocalCluster] = []
    for folder in sorted(home.glob("broker-*")):
        port = client_port(folder / "server.properties")
        if port is not None and (broker := LocalBroker(port=port, data_dir=folder)).pid() is not None:
            found.append(broker)
    for folder in sorted(home.glob("cluster-*")):
        if (folder / "cluster.json").exists():
            cluster = LocalCluster(data_dir=folder)
            if any(node.pid() is not None for node in cluster.nodes.values()):
                found.append(cluster)
    return found


# ---------------------------------------------------------------------------------------------
# A three-node cluster
# ---------------------------------------------------------------------------------------------

NODE_IDS = (1, 2, 3)
DEFAULT_PORT = 9092
TRANSACTION_STATE = "__transaction_state"
READY_TRANSACTIONAL_ID = "eos-cluster-ready"


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a signed 32-bit int."""
    units = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_partition(transactional_id: str, partitions: int) -> int:
    """The __transaction_state partition whose leader coordinates `transactional_id`, as Kafka's
    TransactionStateManager.partitionFor computes it: Utils.abs(hashCode) % partitions. Kafka's
    Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would leave it negative)."""
    value = java_string_hash(transactional_id)
    return (0 if value == -(1 << 31) else abs(value)) % partitions


@dataclass
class NodeStatus:
    node_id: int
    state: str  # "running", "paused" or "stopped"
    pid: int | None
    bootstrap: str
    controller_endpoint: str
    log_file: Path


@dataclass
class ClusterStatus:
    data_dir: Path
    bootstrap: str
    nodes: list[NodeStatus]
    brokers: set[int]  # in the metadata: registered and not fenced
    controller: int | None  # the active controller (quorum leader), None while electing or down
    details: list[str] = field(default_factory=list)
    client_file: Path | None = None  # a secured cluster's client settings (the super user's)

    @property
    def running(self) -> bool:
        return any(node.state != "stopped" for node in self.nodes)

    @property
    def complete(self) -> bool:
        """Every node runs and the metadata lists every broker."""
        return all(node.state == "running" for node in self.nodes) and self.brokers == set(NODE_IDS)


class LocalCluster:
    """Three local Kafka nodes, each broker+controller, on loopback: a real replicated cluster for
    fault-injection tests (kill -9, SIGSTOP, controller failover), from the same Maven jars as LocalBroker.

    Node n (1..3) serves clients on port+2(n-1) and the controller quorum on port+2(n-1)+1, and keeps its
    data in data_dir/node-n. Every node is formatted with one cluster id and the same KIP-853
    `--initial-controllers` list: a dynamic quorum of three voters, which Kafka 4.x documents as the way to
    bootstrap several controllers (static controller.quorum.voters is the deprecated form). The ids and
    ports live in data_dir/cluster.json, because the voter set written at format time pins the
    controllers' endpoints for the life of the cluster."""

    def __init__(
        self,
        port: int | None = None,
        data_dir: Path | str | None = None,
        heap: str = "384m",
        host: str = "127.0.0.1",
        secure: bool | None = None,
    ):
        """`port` None: the port an existing cluster in `data_dir` was formatted with, else 9092. `secure`
        as for LocalBroker: every node SASL_SSL with the StandardAuthorizer, one principal for all brokers."""
        self.data_dir = (
            Path(data_dir).expanduser().resolve() if data_dir else eos_home() / f"cluster-{port or DEFAULT_PORT}"
        )
        if port is None:
            port = self._saved_port() or DEFAULT_PORT
        self.host = host
        self.port = port
        self.heap = heap
        self.security = _security(self.data_dir, secure, self.layout_file.exists(), "cluster")
        self.nodes = {
            n: KafkaNode(
                node_id=n,
                port=port + 2 * (n - 1),
                controller_port=port + 2 * (n - 1) + 1,
                data_dir=self.data_dir / f"node-{n}",
                heap=heap,
                host=host,
                template="cluster.properties",
                jvm_options=CLUSTER_JVM_OPTIONS,
                security=self.security,
            )
            for n in NODE_IDS
        }
        self._procs: dict[int, subprocess.Popen] = {}

    # -- layout -----------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """All three brokers, for clients."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def layout_file(self) -> Path:
        return self.data_dir / "cluster.json"

    def client_settings(self, bootstrap: str | None = None) -> dict[str, str]:
        """librdkafka settings that reach the cluster (all brokers, or `bootstrap`): with the super
        user's credentials if it is secured."""
        bootstrap = bootstrap or self.bootstrap
        if self.security is None:
            return {"bootstrap.servers": bootstrap}
        return self.security.client_settings(bootstrap)

    def node(self, node_id: int) -> KafkaNode:
        if node_id not in self.nodes:
            raise EnvironmentProblem(f"the local cluster has nodes {list(NODE_IDS)}, not {node_id!r}.")
        return self.nodes[node_id]

    def _saved_port(self) -> int | None:
        try:
            return int(json.loads(self.layout_file.read_text())["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _layout(self) -> dict:
        """Cluster id and controller directory ids: made once, then read back (every node is formatted
        with the same ones, and a node restarted later must find the ports it was formatted with)."""
        if self.layout_file.exists():
            layout = json.loads(self.layout_file.read_text())
            if (layout["host"], layout["port"]) != (self.host, self.port):
                raise EnvironmentProblem(
                    f"{self.data_dir} holds a cluster formatted for {layout['host']}:{layout['port']}, "
                    f"not {self.host}:{self.port}: its controllers' endpoints are fixed at format time.",
                    hint=f"use --port {layout['port']}, or another --data-dir (or delete {self.data_dir})",
                )
            return layout
        layout = {
            "cluster_id": kafka_uuid(),
            "host": self.host,
            "port": self.port,
            "directory_ids": {str(n): kafka_uuid() for n in NODE_IDS},
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.layout_file.write_text(json.dumps(layout, indent=2) + "\n")
        return layout

    def _initial_controllers(self, layout: dict) -> str:
        """`id@host:port:directory-id` for each voter, as StorageTool's --initial-controllers wants."""
        ids = layout["directory_ids"]
        return ",".join(f"{n}@{node.controller_endpoint}:{ids[str(n)]}" for n, node in self.nodes.items())

    def _launch(self, nodes: list[KafkaNode], progress: Progress) -> None:
        """Render, format (all at once: each format is a JVM start) and launch stopped nodes."""
        java, classpath, layout = find_java(), java_classpath(progress), self._layout()
        if self.security is not None:
            self.security.make()
            self.security.write_client_file(self.bootstrap)
        last = 2 * len(NODE_IDS) - 1
        controllers = ",".join(other.controller_endpoint for other in self.nodes.values())
        quorum = ("--initial-controllers", self._initial_controllers(layout))
        formats: dict[KafkaNode, subprocess.Popen] = {}
        try:
            for node in nodes:
                hint = f"choose other ports: `eos kafka start --brokers 3 --port N` (uses N..N+{last})"
                node.check_ports_free(hint=hint)
                node.log_dir.mkdir(parents=True, exist_ok=True)
                node.render_properties(controller_bootstrap=controllers)
                cmd = node.format_command(java, classpath, layout["cluster_id"], *quorum)
                if cmd is not None:
                    formats[node] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            outputs = {node: proc.communicate()[0] for node, proc in formats.items()}
        finally:
            for node in nodes:
                node.forget_format_arguments()
        for node, proc in formats.items():
            if proc.returncode != 0:
                raise node.format_failed(outputs[node])
        for node in nodes:
            self._procs[node.node_id] = node.launch(java, classpath)

    def _watched(self) -> dict[KafkaNode, subprocess.Popen]:
        """The processes this object launched and that should still be up."""
        return {self.nodes[n]: proc for n, proc in self._procs.items() if self.nodes[n].pid() == proc.pid}

    # -- whole cluster --------------------------------------------------------------------------
    def start(self, timeout: float = 240.0, progress: Progress = _quiet) -> ClusterStatus:
        """Start every node that is not running (idempotent; a paused node is resumed) and wait until the
        metadata lists all three brokers, a transactional producer can initialise (so __transaction_state
        exists with its replicas) and every partition is fully in sync."""
        started = time.monotonic()
        down = [node for node in self.nodes.values() if node.state() == "stopped"]
        for node in self.nodes.values():
            if node.state() == "paused":
                progress(f"{node.name} was paused; resuming it.")
                node.resume()
        if down:
            self._launch(down, progress)
            progress(
                f"Starting Kafka {kafka_version()} nodes {[node.node_id for node in down]} "
                f"(heap {self.heap} each, data {self.data_dir}) ..."
            )
        try:
            self._wait_ready(started + timeout)
        except EnvironmentProblem:
            for node in down:  # no half-started cluster left behind
                node.stop(kill=True)
            raise
        status = self.status()
        status.details.append(f"ready in {time.monotonic() - started:.1f} s")
        progress(f"Kafka cluster ready at {self.bootstrap} in {time.monotonic() - started:.1f} s.")
        return status

    def _wait_ready(self, deadline: float) -> None:
        everyone = set(NODE_IDS)
        brokers = _wait_until(
            lambda: everyone if self.brokers(timeout=2) == everyone else None,
            deadline, "waiting for all brokers to register", self._watched(),
        )  # fmt: skip
        if brokers is None:
            raise EnvironmentProblem(
                f"the Kafka cluster at {self.bootstrap} did not list all {len(everyone)} brokers in time "
                f"(it lists {sorted(self.brokers())}). {self._log_hint()}"
            )
        self._init_transactions(deadline)
        self.wait_until_healthy(max(1.0, deadline - time.monotonic()))

    def _init_transactions(self, deadline: float) -> None:
        """One transactional producer initialises: __transaction_state is created on first use, with
        replication factor 3, and its coordinator answers."""
        from confluent_kafka import KafkaException

        from eos_connectors.kafka.clients import producer

        client = producer({**self.client_settings(), "transactional.id": READY_TRANSACTIONAL_ID})
        while True:
            remaining = deadline - time.monotonic()
            try:
                client.init_transactions(max(1.0, remaining))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or remaining <= 1:
                    raise EnvironmentProblem(
                        f"no transactional producer could initialise on {self.bootstrap}: {error}. {self._log_hint()}"
                    ) from exc
                _raise_if_exited(self._watched(), "initialising a transactional producer")
                time.sleep(0.5)

    def _log_hint(self) -> str:
        return "Node logs: " + ", ".join(str(node.log_file) for node in self.nodes.values())

    def stop(self, timeout: float = 60.0, kill: bool = False, progress: Progress = _quiet) -> bool:
        """Stop all nodes at once: SIGTERM (a clean shutdown, paused nodes are continued), or SIGKILL with
        kill=True. At once, because a node stopping while the others are already gone waits for a
        controller quorum that no longer exists. Returns False if nothing was running."""
        pids = {node: node.pid() for node in self.nodes.values()}
        pids = {node: pid for node, pid in pids.items() if pid is not None}
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
            if not kill:
                os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for node, pid in pids.items():
            node.wait_gone(pid, max(0.0, deadline - time.monotonic()), progress)
        self._procs.clear()
        progress(f"Kafka cluster in {self.data_dir} {'stopped' if pids else 'was not running'}.")
        return bool(pids)

    def status(self) -> ClusterStatus:
        nodes = [
            NodeStatus(n, node.state(), node.pid(), node.bootstrap, node.controller_endpoint, node.log_file)
            for n, node in self.nodes.items()
        ]
        running = any(node.state != "stopped" for node in nodes)
        brokers = self.brokers() if running else set()
        controller = self.active_controller(timeout=0) if running else None
        client_file = self.security.client_file if self.security is not None else None
        return ClusterStatus(self.data_dir, self.bootstrap, nodes, brokers, controller, client_file=client_file)

    # -- one node ---------------------------------------------------------------------------
    def start_node(self, node_id: int, timeout: float = 120.0, progress: Progress = _quiet) -> float:
        """Start (or resume) one node and wait until the cluster is whole again: all brokers listed and
        every partition in sync. Returns the seconds that took."""
        started = time.monotonic()
        node = self.node(node_id)
        if node.state() == "paused":
            node.resume()
        elif node.state() == "stopped":
            self._launch([node], progress)
        progress(f"{node.name} starting (pid {node.pid()}) ...")
        rejoined = _wait_until(
            lambda: True if node_id in self.brokers(timeout=2) else None,
            started + timeout, "rejoining the cluster", self._watched(),
        )  # fmt: skip
        if rejoined is None:
            raise EnvironmentProblem(
                f"{node.name} did not rejoin the cluster within {timeout:.0f} s. Last lines of {node.log_file}:\n"
                + tail(node.log_file)
            )
        self.wait_until_healthy(max(1.0, started + timeout - time.monotonic()))
        progress(f"{node.name} back in {time.monotonic() - started:.1f} s.")
        return time.monotonic() - started

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        """A clean shutdown of one node (SIGTERM): it hands its leaderships over first."""
        self.node(node_id).stop(timeout=timeout)
        self._procs.pop(node_id, None)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: a crash, no controlled shutdown; its leaderships move once its broker
        session times out. An error if the node is not running (a test that kills nothing proves nothing)."""
        node = self.node(node_id)
        node.wait_gone(node.send_signal(signal.SIGKILL), timeout=30)
        self._procs.pop(node_id, None)

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node: alive with open sockets but unresponsive (a GC pause or hung VM), not a crash."""
        self.node(node_id).pause()

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        self.node(node_id).resume()

    def restart(self, node_id: int, kill: bool = False, timeout: float = 120.0) -> float:
        """Stop one node (cleanly, or SIGKILL with kill=True), start it again and wait until the cluster
        is whole. Returns the seconds the start took."""
        if kill:
            self.kill(node_id)
        else:
            self.stop_node(node_id)
        return self.start_node(node_id, timeout=timeout)

    # -- who does what ----------------------------------------------------------------------
    def reachable_bootstrap(self, controllers: bool = False) -> str:
        """Brokers (or with controllers=True the controller endpoints) of the running nodes only: a
        paused node accepts connections and never answers, which stalls a request until it times out."""
        running = [node for node in self.nodes.values() if node.state() == "running"]
        return ",".join(node.controller_endpoint if controllers else node.bootstrap for node in running)

    def metadata(self, timeout: float = 5.0, topic: str | None = None):
        """Cluster metadata (confluent_kafka ClusterMetadata) from a running node, or None."""
        bootstrap = self.reachable_bootstrap()
        return _metadata(self.client_settings(bootstrap), timeout, topic) if bootstrap else None

    def _unanswered(self) -> EnvironmentProblem:
        states = ", ".join(f"node {n} {node.state()}" for n, node in self.nodes.items())
        return EnvironmentProblem(
            f"no running node of the cluster in {self.data_dir} answered a metadata request ({states}).",
            hint="start it with LocalCluster.start() or `eos kafka start --brokers 3`",
        )

    def brokers(self, timeout: float = 5.0) -> set[int]:
        """Broker ids in the metadata: registered and unfenced. A killed or paused node drops out once its
        broker session times out (broker.session.timeout.ms)."""
        metadata = self.metadata(timeout)
        return set(metadata.brokers) if metadata is not None else set()

    def leader(self, topic: str, partition: int, timeout: float = 5.0) -> int | None:
        """The node leading a partition per the metadata, None if it has no leader."""
        metadata = self.metadata(timeout, topic)
        if metadata is None:
            raise self._unanswered()
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or partition not in info.partitions:
            why = info.error if info is not None and info.error is not None else "no such topic or partition"
            raise EnvironmentProblem(f"{topic}[{partition}] is not in the metadata of {self.bootstrap} ({why}).")
        leader = info.partitions[partition].leader
        return leader if leader >= 0 else None

    def transaction_coordinator(self, transactional_id: str, timeout: float = 5.0) -> int | None:
        """The node coordinating `transactional_id`: the leader of its __transaction_state partition."""
        metadata = self.metadata(timeout, TRANSACTION_STATE)
        if metadata is None:
            raise self._unanswered()
        info = metadata.topics.get(TRANSACTION_STATE)
        if info is None or info.error is not None:
            raise EnvironmentProblem(
                f"{TRANSACTION_STATE} is not in the metadata of {self.bootstrap}: Kafka creates it on the first "
                "transactional producer's start, which LocalCluster.start() does."
            )
        return self.leader(TRANSACTION_STATE, transaction_partition(transactional_id, len(info.partitions)), timeout)

    def under_replicated(self, timeout: float = 5.0) -> list[str] | None:
        """Partitions (internal topics included) without a leader or with replicas outside the ISR; None
        if no node answered."""
        metadata = self.metadata(timeout)
        if metadata is None:
            return None
        return [
            f"{topic.topic}[{p.id}] leader {p.leader} isr {sorted(p.isrs)} replicas {sorted(p.replicas)}"
            for topic in metadata.topics.values()
            for p in topic.partitions.values()
            if p.leader < 0 or set(p.isrs) != set(p.replicas)
        ]

    def wait_until_healthy(self, timeout: float = 120.0) -> None:
        """Wait until the metadata lists every broker and every partition is led and fully in sync."""
        everyone = set(NODE_IDS)

        def healthy() -> bool | None:
            lagging = self.under_replicated(timeout=2)
            return True if lagging == [] and self.brokers(timeout=2) == everyone else None

        if _wait_until(healthy, time.monotonic() + timeout, "waiting for the cluster to heal", self._watched()):
            return
        raise EnvironmentProblem(
            f"the Kafka cluster at {self.bootstrap} is not whole after {timeout:.0f} s: "
            f"brokers {sorted(self.brokers())}, out of sync: {(self.under_replicated() or [])[:10]}. {self._log_hint()}"
        )

    def active_controller(self, timeout: float = 30.0) -> int | None:
        """The quorum leader, from the `quorum-state` file each controller keeps in its metadata log
        directory (no JVM tool, no request): the node that says it leads the highest epoch any running
        node has seen, confirmed by a majority of the voters. Waits up to `timeout` for an election to
        settle; None if none settled."""
        return _wait_until(self._settled_leader, time.monotonic() + timeout, "", interval=0.1)

    def _settled_leader(self) -> int | None:
        views = {}
        for n, node in self.nodes.items():
            if node.state() == "running":
                view = _quorum_state(node.log_dir)
                if view is not None:
                    views[n] = view
        if not views:
            return None
        epoch = max(epoch for _, epoch in views.values())
        leaders = {leader for leader, e in views.values() if e == epoch}
        if len(leaders) != 1:
            return None
        (leader,) = leaders
        agree = sum(1 for view in views.values() if view == (leader, epoch))
        if leader in views and views[leader] == (leader, epoch) and agree > len(NODE_IDS) // 2:
            return leader
        return None


def _quorum_state(log_dir: Path) -> tuple[int, int] | None:
    """(leaderId, leaderEpoch) from a controller's quorum-state file (JSON the Raft client rewrites on
    every election state change); None if unreadable or if this node knows no leader."""
    try:
        state = json.loads((log_dir / "__cluster_metadata-0" / "quorum-state").read_text())
    except (OSError, ValueError):
        return None
    leader, epoch = state.get("leaderId", -1), state.get("leaderEpoch", -1)
    return (leader, epoch) if leader >= 0 else None

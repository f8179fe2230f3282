"""A real single-node HDFS on loopback: a NameNode and a DataNode, each its own JVM.

Why: eos keeps its checkpoint (and small metadata files written temp-then-rename) on whatever
file system the user points it at, and HDFS is the one production deployments use. Its rename,
visibility and restart behaviour differ from a local disk, so tests run against the real
servers, at the same Hadoop version as the client PySpark bundles. No Docker and no Hadoop
install: the jars come from Maven Central with `ops/hadoop/pom.xml` (cached under
$EOS_HOME/hadoop/<hash of the pom>/libs), the daemons are started with `java -cp`.

A `LocalHdfs` is identified by its data directory: the conf, the NameNode metadata, the
DataNode blocks, the logs and the pid files all live there, so a second `LocalHdfs` on the
same directory sees (and can stop) the daemons of the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, fields
from pathlib import Path
from xml.sax.saxutils import escape

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, ops_dir
from eos_ops import jvm
from eos_ops.jvm import Progress, quiet

MAIN_CLASS = {
    "namenode": "org.apache.hadoop.hdfs.server.namenode.NameNode",
    "datanode": "org.apache.hadoop.hdfs.server.datanode.DataNode",
}
ROLES = tuple(MAIN_CLASS)  # start order: the DataNode registers with the NameNode
# The daemons' HTTP servers look these web apps up on the classpath and refuse to start without
# them. The jars on Maven Central do not carry them (a Hadoop tarball has them next to the jars);
# empty ones suffice: the servlets we use (/jmx, WebHDFS) are registered in code.
WEB_APPS = ("hdfs", "datanode", "static")
SERVICE = "the local HDFS"

# Hadoop client settings (for a Spark session: prefix each key with "spark.hadoop.") that let a
# client ride out a NameNode restart. By default the HDFS client does not retry its NameNode
# calls: with the NameNode down an operation fails at once (ConnectException, or EOFException on
# a connection the NameNode dropped), and a write while it is still in safe mode fails with
# SafeModeException. With the retry policy on, both are retried: every ~1 s (randomised +-50%),
# up to 120 times. Measured in tests/integration/test_hdfs.py.
RESTART_TOLERANT_CLIENT = {
    "dfs.client.retry.policy.enabled": "true",
    "dfs.client.retry.policy.spec": "1000,120",
}


def hadoop_ops_dir() -> Path:
    return ops_dir() / "hadoop"


def hadoop_version() -> str:
    """The Hadoop version the pom pins (the one place it is written)."""
    match = re.search(r"<hadoop.version>([^<]+)</hadoop.version>", (hadoop_ops_dir() / "pom.xml").read_text())
    return match.group(1) if match else "unknown"


def fetch_hadoop_jars(progress: Progress = quiet) -> Path:
    """The NameNode/DataNode jars, resolved from Maven Central on first use."""
    return jvm.fetch_jars(
        hadoop_ops_dir() / "pom.xml", eos_home() / "hadoop", f"Apache Hadoop {hadoop_version()} HDFS", progress
    )


@dataclass(frozen=True)
class HdfsPorts:
    """Every port the two daemons listen on, all on the loopback host."""

    namenode: int  # RPC: the port in hdfs://host:PORT
    namenode_http: int  # web UI, /jmx (readiness), WebHDFS
    datanode: int  # block data transfer (clients stream blocks here)
    datanode_ipc: int
    datanode_http: int

    @classmethod
    def choose(cls, namenode: int | None = None, keep: HdfsPorts | None = None, host: str = "127.0.0.1") -> HdfsPorts:
        """`namenode` (else a free port) and, for the others, `keep`'s where still free, else free ones."""
        spare = iter(jvm.free_ports(len(fields(cls)), host))
        chosen = {}
        for field in fields(cls):
            wanted = namenode if field.name == "namenode" else (getattr(keep, field.name) if keep else None)
            usable = wanted is not None and (field.name == "namenode" or jvm.port_is_free(host, wanted))
            chosen[field.name] = wanted if usable else next(spare)
        return cls(**chosen)

    def of(self, role: str) -> dict[str, int]:
        return {name: port for name, port in vars(self).items() if name.startswith(role)}


@dataclass
class HdfsStatus:
    url: str
    data_dir: Path
    namenode_pid: int | None
    datanode_pid: int | None
    safe_mode: bool | None = None  # None: the NameNode did not answer
    live_datanodes: int | None = None
    capacity_remaining: int | None = None  # bytes the DataNode reported free
    datanode_registered: bool | None = None  # the DataNode's view: handshake with the NameNode done
    ready_in: float | None = None  # seconds the start (or restart) took

    @property
    def running(self) -> bool:
        return self.namenode_pid is not None and self.datanode_pid is not None

    @property
    def ready(self) -> bool:
        """Writable: out of safe mode with a live DataNode that has reported its storage.

        Both sides are asked: after a DataNode restart the NameNode still counts the old process as
        live until its heartbeats expire, so only the DataNode can say the new one has registered."""
        namenode_side = self.safe_mode is False and (self.live_datanodes or 0) >= 1
        return namenode_side and (self.capacity_remaining or 0) > 0 and self.datanode_registered is True


class LocalHdfs:
    """One NameNode + one DataNode on loopback, identified by `data_dir`.

    `namenode_port` fixes the RPC port (the URL); None picks a free one on first start and keeps it
    in the conf, so later starts serve the same URL (checkpoint paths embed it)."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        namenode_port: int | None = None,
        heap: str = "256m",
        host: str = "127.0.0.1",
    ):
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else eos_home() / "hdfs"
        self.namenode_port = namenode_port
        self.heap = heap
        self.host = host

    # -- files ------------------------------------------------------------------------------
    @property
    def conf_dir(self) -> Path:
        """core-site.xml, hdfs-site.xml, log4j.properties: first on the daemons' classpath."""
        return self.data_dir / "conf"

    @property
    def name_dir(self) -> Path:
        return self.data_dir / "name"

    @property
    def blocks_dir(self) -> Path:
        return self.data_dir / "blocks"

    def log_file(self, role: str) -> Path:
        return self.data_dir / f"{_role(role)}.log"

    def pid_file(self, role: str) -> Path:
        return self.data_dir / f"{_role(role)}.pid"

    # -- ports and URL ------------------------------------------------------------------------
    def ports(self) -> HdfsPorts | None:
        """The ports the conf on disk names (those of the running daemons), if written yet."""
        site = _read_site(self.conf_dir / "hdfs-site.xml")
        try:
            return HdfsPorts(**{name: _port(site[key]) for name, key in PORT_KEYS.items()})
        except (KeyError, ValueError):
            return None

    @property
    def url(self) -> str:
        """hdfs://host:port of the NameNode: the prefix of every path on this HDFS."""
        ports = self.ports()
        port = self.namenode_port or (ports.namenode if ports else None)
        if port is None:
            raise EnvironmentProblem(
                f"{SERVICE} in {self.data_dir} has no port yet: it picks a free one on its first start.",
                hint="call start() first, or pass namenode_port",
            )
        return f"hdfs://{self.host}:{port}"

    # -- process ----------------------------------------------------------------------------
    def pid(self, role: str) -> int | None:
        """PID of this data directory's NameNode or DataNode, if alive."""
        return jvm.pid_from_file(self.pid_file(role), MAIN_CLASS[_role(role)], str(self.conf_dir))

    def status(self) -> HdfsStatus:
        ports = self.ports()
        url = self.url if ports or self.namenode_port else "(not started yet)"
        status = HdfsStatus(url, self.data_dir, self.pid("namenode"), self.pid("datanode"))
        if status.namenode_pid is not None and ports is not None:
            bean = self._jmx(ports.namenode_http, "Hadoop:service=NameNode,name=FSNamesystemState")
            if bean:
                status.safe_mode = bean.get("FSState") != "Operational"
                status.live_datanodes = bean.get("NumLiveDataNodes")
                status.capacity_remaining = bean.get("CapacityRemaining")
        if status.datanode_pid is not None and ports is not None:
            bean = self._jmx(ports.datanode_http, "Hadoop:service=DataNode,name=DataNodeInfo")
            if bean:
                actors = json.loads(bean.get("BPServiceActorInfo") or "[]")
                status.datanode_registered = any(a.get("ActorState") == "RUNNING" for a in actors)
        return status

    def _jmx(self, http_port: int, bean: str) -> dict | None:
        """One JMX bean of a daemon, read from its /jmx servlet (None if it does not answer yet)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{http_port}/jmx?qry={bean}", timeout=2) as response:
                beans = json.load(response).get("beans") or [None]
        except (OSError, ValueError):
            return None
        return beans[0]

    def start(self, progress: Progress = quiet, timeout: float = 180.0) -> HdfsStatus:
        """Start whichever daemon is not running (idempotent) and wait until HDFS takes writes.

        Formats the NameNode on first start. Returns the status with `ready_in` (seconds)."""
        started = time.monotonic()
        running = {role: self.pid(role) for role in ROLES}
        if all(running.values()) and (status := self.status()).ready:
            progress(f"HDFS already running at {self.url} (pids {status.namenode_pid}, {status.datanode_pid}).")
            return status
        java = jvm.find_java(SERVICE)
        libs = fetch_hadoop_jars(progress)
        if not any(running.values()):  # the ports are fixed while either daemon runs
            self._write_conf(self._choose_ports())
        self._format_once(java, libs)
        launched = {role: self._launch(role, java, libs) for role in ROLES if running[role] is None}
        progress(f"Starting HDFS {hadoop_version()} ({', '.join(launched) or 'nothing to launch'}) at {self.url} ...")
        status = self._await_ready(launched, timeout)
        status.ready_in = time.monotonic() - started
        progress(f"HDFS ready at {self.url} in {status.ready_in:.1f} s.")
        return status

    def restart_namenode(self, progress: Progress = quiet, timeout: float = 180.0, kill: bool = False) -> HdfsStatus:
        """Stop the NameNode (SIGTERM, or SIGKILL with kill=True), start it and wait until writable.

        The DataNode keeps running and re-registers; `ready_in` counts from the stop."""
        started = time.monotonic()
        pid = self.pid("namenode")
        if pid is not None:
            jvm.terminate(pid, kill=kill)
        self.pid_file("namenode").unlink(missing_ok=True)
        status = self.start(progress, timeout)
        status.ready_in = time.monotonic() - started
        return status

    def kill(self, which: str) -> bool:
        """SIGKILL one daemon ("namenode" or "datanode"): a crash, no clean shutdown. False if not running."""
        pid = self.pid(which)
        if pid is not None:
            jvm.terminate(pid, kill=True)
        self.pid_file(which).unlink(missing_ok=True)
        return pid is not None

    def stop(self, kill: bool = False, progress: Progress = quiet, timeout: float = 60.0) -> bool:
        """Stop both daemons: SIGTERM and a clean shutdown, or SIGKILL with kill=True.

        The DataNode goes first, so it does not spend the NameNode's shutdown retrying it.
        Returns False if neither was running."""
        stopped = False
        for role in reversed(ROLES):
            pid = self.pid(role)
            if pid is not None:
                if jvm.terminate(pid, timeout=timeout, kill=kill):
                    progress(f"The {role} did not stop within {timeout:.0f} s; killed it.")
                stopped = True
            self.pid_file(role).unlink(missing_ok=True)
        progress(f"HDFS in {self.data_dir} stopped." if stopped else f"No HDFS running for {self.data_dir}.")
        return stopped

    # -- start-up steps -------------------------------------------------------------------------
    def _choose_ports(self) -> HdfsPorts:
        stored = self.ports()
        namenode = self.namenode_port or (stored.namenode if stored else None)
        if namenode is not None and not jvm.port_is_free(self.host, namenode):
            raise EnvironmentProblem(
                f"port {namenode} on {self.host} (the HDFS NameNode, {self.data_dir}) is in use by another process.",
                hint="stop that process, or use another data directory or namenode_port",
            )
        return HdfsPorts.choose(namenode, keep=stored, host=self.host)

    def _write_conf(self, ports: HdfsPorts) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        for app in WEB_APPS:
            (self.conf_dir / "webapps" / app).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hadoop_ops_dir() / "log4j.properties", self.conf_dir / "log4j.properties")
        url = f"hdfs://{self.host}:{ports.namenode}"
        (self.conf_dir / "core-site.xml").write_text(_site_xml(core_site(url, self.data_dir)))
        (self.conf_dir / "hdfs-site.xml").write_text(_site_xml(hdfs_site(ports, self.host, self.data_dir)))

    def _format_once(self, java: str, libs: Path) -> None:
        """`hdfs namenode -format` on first start; a new namespace makes old DataNode blocks void."""
        if (self.name_dir / "current" / "VERSION").exists():
            return
        shutil.rmtree(self.blocks_dir, ignore_errors=True)
        log = self.data_dir / "format.log"
        cmd = [*self._java_cmd(java, libs, "namenode"), "-format", "-nonInteractive", "-force"]
        with open(log, "wb") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.data_dir).returncode
        if code != 0:
            raise EnvironmentProblem(f"formatting the HDFS NameNode in {self.name_dir} failed:\n{jvm.tail(log)}")

    def _java_cmd(self, java: str, libs: Path, role: str) -> list[str]:
        # Serial GC and C1 only: two small JVMs on a small, busy machine start faster that way.
        return [
            java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true", f"-Dhadoop.log.dir={self.data_dir}",
            "-cp", f"{self.conf_dir}{os.pathsep}{libs / '*'}", MAIN_CLASS[role],
        ]  # fmt: skip

    def _launch(self, role: str, java: str, libs: Path) -> subprocess.Popen:
        ports = self.ports()
        assert ports is not None, "the conf is written before any daemon starts"
        for name, port in ports.of(role).items():
            if not jvm.port_is_free(self.host, port):
                raise EnvironmentProblem(
                    f"port {port} on {self.host} ({name.replace('_', ' ')}) is in use by another process.",
                    hint=f"stop that process, or `LocalHdfs({str(self.data_dir)!r}).stop()` and start again "
                    "(the ports other than the NameNode's are chosen anew on a full start)",
                )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        proc = jvm.spawn(self._java_cmd(java, libs, role), self.log_file(role), cwd=self.data_dir)
        self.pid_file(role).write_text(str(proc.pid))
        return proc

    def _await_ready(self, launched: dict[str, subprocess.Popen], timeout: float) -> HdfsStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raise_if_exited(launched)
            status = self.status()
            if status.ready:
                return status
            time.sleep(0.25)
        status = self.status()
        self.stop(kill=True)
        raise EnvironmentProblem(
            f"HDFS at {self.url} did not become writable within {timeout:.0f} s (safe mode: {status.safe_mode}, "
            f"live DataNodes: {status.live_datanodes}).\n" + self._log_tails()
        )

    def _raise_if_exited(self, launched: dict[str, subprocess.Popen]) -> None:
        for role in ROLES:
            # For a daemon launched here, ask its Popen: right after the fork its /proc cmdline is
            # briefly empty, so the pid-file check would call a starting daemon dead.
            proc = launched.get(role)
            code = proc.poll() if proc else None
            if (proc is not None and code is None) or (proc is None and self.pid(role) is not None):
                continue
            self.stop(kill=True)
            how = f"exited with code {code}" if code is not None else "is no longer running"
            raise EnvironmentProblem(f"the HDFS {role} {how} during start-up.\n" + self._log_tails(role))

    def _log_tails(self, *roles: str) -> str:
        return "\n".join(f"Last lines of {self.log_file(r)}:\n{jvm.tail(self.log_file(r))}" for r in roles or ROLES)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

PORT_KEYS = {
    "namenode": "dfs.namenode.rpc-address",
    "namenode_http": "dfs.namenode.http-address",
    "datanode": "dfs.datanode.address",
    "datanode_ipc": "dfs.datanode.ipc.address",
    "datanode_http": "dfs.datanode.http.address",
}


def core_site(url: str, data_dir: Path) -> dict[str, str]:
    return {
        "fs.defaultFS": url,
        "hadoop.tmp.dir": str(data_dir / "tmp"),
        # The daemons' own RPC client (the DataNode's link to the NameNode). The default, 10 tries
        # 1 s apart and then a 5 s back-off, makes the DataNode re-register up to 15 s after a
        # NameNode restart; polling every 0.2 s for 20 s makes it well under a second.
        "ipc.client.connect.retry.interval": "200",
        "ipc.client.connect.max.retries": "100",
    }


def hdfs_site(ports: HdfsPorts, host: str, data_dir: Path) -> dict[str, str]:
    def at(port: int) -> str:
        return f"{host}:{port}"

    return {
        **{key: at(getattr(ports, name)) for name, key in PORT_KEYS.items()},
        # HTTPS is off (dfs.http.policy HTTP_ONLY); should it be turned on, never on 0.0.0.0.
        "dfs.namenode.https-address": at(0),
        "dfs.datanode.https.address": at(0),
        "dfs.namenode.name.dir": (data_dir / "name").as_uri(),
        "dfs.datanode.data.dir": (data_dir / "blocks").as_uri(),
        "dfs.replication": "1",
        "dfs.permissions.enabled": "false",
        # Leave safe mode as soon as one DataNode has reported its blocks, with no 30 s extension.
        "dfs.namenode.safemode.extension": "0",
        "dfs.namenode.safemode.min.datanodes": "1",
        # Quick heartbeats: a restarted NameNode learns of the DataNode within a second, and a
        # killed DataNode is declared dead after 2 x 5 s + 10 x 1 s = 20 s instead of 10.5 minutes.
        "dfs.heartbeat.interval": "1",
        "dfs.namenode.heartbeat.recheck-interval": "5000",
        # Loopback may have no reverse DNS entry; the NameNode must still accept the DataNode.
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
    }


def _site_xml(properties: dict[str, str]) -> str:
    lines = [
        '<?xml version="1.0"?>',
        "<!-- Written by eos_ops.hdfs on each full start: edits here are overwritten. -->",
        "<configuration>",
        *(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>" for k, v in properties.items()),
        "</configuration>",
    ]
    return "\n".join(lines) + "\n"


def _read_site(path: Path) -> dict[str, str]:
    with contextlib.suppress(OSError, ET.ParseError):
        root = ET.parse(path).getroot()
        return {p.findtext("name") or "": p.findtext("value") or "" for p in root.iter("property")}
    return {}


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _role(which: str) -> str:
    if which not in MAIN_CLASS:
        raise ValueError(f"unknown HDFS daemon {which!r}: expected one of {', '.join(MAIN_CLASS)}")
    return which

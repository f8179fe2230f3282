"""Running a background JVM service from jars resolved with Maven: the parts any such service shares.

The local Kafka broker (`localkafka`) and the local HDFS (`hdfs`) both need a Java 17+, a jar
cache keyed by the hash of a pom, free loopback ports, and pid files that survive PID reuse.
Error messages name the service, so a user sees "the local HDFS needs Java 17", not Kafka.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from eos.errors import EnvironmentProblem

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log, for error messages (a start-up failure is explained there)."""
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Java and the jar cache
# ---------------------------------------------------------------------------------------------


def find_java(needed_by: str) -> str:
    """Path of a Java >= 17 executable, or an error saying that `needed_by` needs one."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise EnvironmentProblem(
            f"Java was not found: {needed_by} needs Java 17 or later.",
            hint="install a JDK 17+ (e.g. `apt install openjdk-17-jre-headless`) or set JAVA_HOME",
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < 17:
        raise EnvironmentProblem(
            f"{java} is Java {major or '?'}; {needed_by} needs Java 17 or later.",
            hint="point JAVA_HOME at a JDK 17+",
        )
    return java


def jar_cache_dir(pom: Path, cache_root: Path) -> Path:
    """Where the jars of `pom` live: a new pom (another version) never reuses an old cache."""
    return cache_root / hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def fetch_jars(pom: Path, cache_root: Path, what: str, progress: Progress = quiet) -> Path:
    """Resolve the runtime jars of `pom` from Maven Central once; returns the libs folder.

    The jars land in a staging folder renamed into place, and a `.complete` marker is written
    last, so an interrupted download is redone rather than half-used."""
    cache = jar_cache_dir(pom, cache_root)
    libs = cache / "libs"
    if (cache / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem(
            f"Maven (mvn) was not found: it is needed once, to fetch the {what} jars.",
            hint="install Maven (e.g. `apt install maven`)",
        )
    progress(f"Fetching {what} jars from Maven Central into {libs} (once) ...")
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
    cmd = [
        mvn, "-B", "-q", "-f", str(pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            cache.rmdir()  # only if empty: no cache folder for a pom that never resolved
        raise _maven_failed(what, cmd, (result.stdout + result.stderr).strip())
    if libs.exists():
        shutil.rmtree(libs)
    staging.rename(libs)
    (cache / ".complete").write_text(what)
    jars = len(list(libs.glob("*.jar")))
    progress(f"Fetched {jars} jars in {time.monotonic() - started:.1f} s.")
    return libs


def _maven_failed(what: str, cmd: list[str], output: str) -> EnvironmentProblem:
    # "could not be resolved" alone also means a wrong coordinate; only network failures say offline.
    offline = re.search(r"Could not transfer|UnknownHost|offline|Connection refused|Network is unreachable", output)
    return EnvironmentProblem(
        f"Maven could not fetch the {what} jars"
        + (" (Maven Central unreachable: are you offline?)" if offline else "")
        + f".\n  command: {' '.join(cmd)}\n  last lines:\n"
        + "\n".join("    " + line for line in output.splitlines()[-15:]),
        hint="check network access to https://repo1.maven.org, or a Maven mirror in ~/.m2/settings.xml",
    )


# ---------------------------------------------------------------------------------------------
# Ports
# ---------------------------------------------------------------------------------------------


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of bind to port 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def daemon_port_pool() -> range:
    """Where the local daemons' ports come from: below the kernel's ephemeral range when there is room.

    Why not bind(0): that gives an ephemeral port, and the kernel hands those out on its own. A
    daemon's port stays fixed across its restarts (its clients and the pipelines' configs know it),
    and while it is down any outgoing connection, or any other process's bind(0), may be given that
    very port: then the daemon cannot come back. A port outside that range is only ever taken by
    someone asking for it by number."""
    low, _ = ephemeral_range()
    return range(10000, low) if low - 10000 > 1000 else range(low, 65536)


def free_ports(count: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> list[int]:
    """`count` distinct TCP ports from `daemon_port_pool()`, free right now and none of them in `avoid`."""
    taken, pool = set(avoid), daemon_port_pool()
    ports: list[int] = []
    for _ in range(20 * count + 100):
        port = random.choice(pool)
        if port not in taken and port_is_free(host, port):
            taken.add(port)
            ports.append(port)
            if len(ports) == count:
                return ports
    raise EnvironmentProblem(f"could not find {count} free TCP ports on {host} in {pool.start}-{pool.stop - 1}")


def free_port_run(span: int, host: str = "127.0.0.1") -> int:
    """The first of `span` adjacent TCP ports from `daemon_port_pool()` that are all free right now."""
    pool = daemon_port_pool()
    for _ in range(200):
        port = random.randrange(pool.start, pool.stop - span + 1)
        if all(port_is_free(host, port + i) for i in range(span)):
            return port
    raise EnvironmentProblem(f"could not find {span} adjacent free TCP ports on {host} in {pool.start}-{pool.stop - 1}")


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections there (a server is listening)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Background processes identified by a pid file
# ---------------------------------------------------------------------------------------------


def pid_from_file(pid_file: Path, *markers: str) -> int | None:
    """PID in `pid_file` if that process is alive and its command line holds every marker.

    The markers guard against PID reuse: a stale pid file must not make us signal a stranger."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    if all(marker in cmdline for marker in markers) and alive(pid):
        return pid
    return None


def split_stat(stat: str) -> tuple[str, list[str]]:
    """A /proc stat line's command (or thread) name and the fields after it (state first, then the
    parent pid...). The name may hold spaces and parentheses: it ends at the last ')'."""
    end = stat.rindex(")")
    return stat[stat.index("(") + 1 : end], stat[end + 1 :].split()


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (split_stat), None if the process is gone."""
    try:
        return split_stat(Path(f"/proc/{pid}/stat").read_text())[1]
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """True until the process is gone: all its threads have exited and with them its sockets and
    files. Also for a process of another account (a server run as an unprivileged user).

    A zombie main thread is not enough: a JVM's main thread exits (state Z in /proc/PID/stat)
    while its other threads still tear down, holding its listening sockets for tens of ms more,
    longer on a busy machine. Measured on a SIGTERMed NameNode: Z at 0.35 s, its RPC port free
    at 0.37 s. Calling it gone at the first Z made a restart find its own port "in use" (CI)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists; /proc says whether it is a zombie
    fields = stat_fields(pid)
    if not fields:
        return False
    if fields[0] != "Z":
        return True
    try:  # our child: the kernel lets us reap it only once every thread is gone
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:  # someone else's: gone when no thread but the zombie is left
        try:
            return len(os.listdir(f"/proc/{pid}/task")) > 1
        except OSError:
            return False


def wait_gone(pids: Iterable[int], timeout: float = math.inf) -> list[int]:
    """Wait until every pid is gone (see alive); returns those still alive after `timeout`.

    Looks once more at the deadline, so a timeout of 0 is a plain check."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        remaining = [pid for pid in remaining if alive(pid)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(0.05)


def wait_or_kill(pid: int, timeout: float, on_kill: Callable[[], None] = lambda: None) -> bool:
    """Wait until `pid` is gone; after `timeout`, call `on_kill`, SIGKILL it and wait again.
    Returns True if it had to kill."""
    if not wait_gone([pid], timeout):
        return False
    on_kill()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_gone([pid])
    return True


def terminate(pid: int, timeout: float = 60.0, kill: bool = False) -> bool:
    """SIGTERM (a clean shutdown) or SIGKILL (a crash) and wait until gone.

    Escalates to SIGKILL after `timeout`. Returns True if it had to escalate."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    return wait_or_kill(pid, timeout)


def spawn(cmd: list[str], log_file: Path, cwd: Path) -> subprocess.Popen:
    """Start a daemon in its own session (it ignores the terminal's Ctrl-C), logging to `log_file`."""
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True
        )

"""PySpark's streaming source runners, forked from a process that has PySpark imported.

Why: when a query starts, Spark starts one Python process per scan of a Python data source (its
"streaming source runner", `python -m pyspark.sql.streaming.python_streaming_source_runner`),
one after the other, and waits for each. A new process spends ~0.2 s importing PySpark, pyarrow
and numpy before it can answer; an eos pipeline has two scans per source (eos.protocol.barrier),
so ~0.4 s of every start and restart went there (bench/NOTES.md, 2026-11-27). PySpark forks its
task workers from a daemon for the same reason; it does not for these runners.

How: local sessions run Spark's Python processes through eos's launcher (eos.sparksession). For
the runner module, and only when `EOS_RUNNER_FORKS` names a live fork server's socket, the
launcher runs the small client below instead of a new interpreter with PySpark. The client hands
the server its arguments, environment, working directory and standard streams (the descriptors
themselves, SCM_RIGHTS); the server forks a child that takes them over and runs the module as
Python would have; the client relays signals to the child and exits with its status, so Spark's
handle on the process behaves as before. When anything is missing (no server, a refused
request), the client runs the module itself, as without eos.

The server is started by the driver (`start()`), in the driver's process group (a failpoint's
`kill -9` of the group takes it and its children, like the runners it replaces), listens on a
socket in a private folder, forks only the runner module, and ends when the driver does (its
stdin, a pipe from the driver, reaches end-of-file). It is single-threaded: a child forked from
it holds no other thread's locks. Set `EOS_NO_RUNNER_FORKS=1` to start runners as Spark does.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
SOCKET_ENV = "EOS_RUNNER_FORKS"
DISABLE_ENV = "EOS_NO_RUNNER_FORKS"
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")

# The client, run by the launcher with `python -S -I -c CLIENT -m MODULE ARGS...`: the standard
# library only, no site-packages, so it starts in ~10 ms. No single quote in it: the launcher
# quotes it with single quotes.
CLIENT = """
import array, json, os, signal, socket, struct, sys
argv = sys.argv[1:]
def own():
    os.execv(sys.executable, [sys.executable] + argv)
def read(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["EOS_RUNNER_FORKS"])
    cred = getattr(socket, "SO_PEERCRED", None)
    if cred and struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, cred, 12))[1] != os.geteuid():
        own()
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    message = struct.pack("!I", len(body)) + body
    sent = s.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    s.sendall(message[sent:])
    pid = read(s, 4)
except OSError:
    own()
if pid is None:
    own()
pid = struct.unpack("!i", pid)[0]
if pid <= 0:
    own()
def relay(signum, frame):
    try:
        os.kill(pid, signum)
    except OSError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(signum, relay)
status = read(s, 4)
code = 1 if status is None else struct.unpack("!i", status)[0]
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
"""


# ---------------------------------------------------------------------------------------------
# The driver's side
# ---------------------------------------------------------------------------------------------

_server: dict[str, Any] = {}
_lock = threading.Lock()


def use(launched: bool) -> None:
    """Point Spark's Python processes at this process's server when they run eos's launcher
    (`launched`), and at none otherwise. A variable inherited from the eos process that started
    this one names that process's server: it is replaced or dropped, never used."""
    path = start() if launched else None
    if path is None:
        os.environ.pop(SOCKET_ENV, None)
    else:
        os.environ[SOCKET_ENV] = path


def start() -> str | None:
    """The socket of this process's fork server, started on first use; None where none can run
    (not POSIX, or EOS_NO_RUNNER_FORKS set). The server imports PySpark while Spark's JVM starts."""
    if os.name != "posix" or not hasattr(socket, "AF_UNIX") or os.environ.get(DISABLE_ENV):
        return None
    with _lock:
        proc = _server.get("proc")
        if proc is not None and proc.poll() is None:
            return _server["path"]
        folder = _private_folder()
        path = str(folder / "sock")
        proc = subprocess.Popen(
            [sys.executable, "-m", "eos.runnerforks", path],
            stdin=subprocess.PIPE,  # the server ends when this pipe does: when the driver ends
            stdout=subprocess.DEVNULL,
        )
        _server.update(proc=proc, path=path, folder=folder)
        atexit.register(_stop, proc, folder)
        return path


def _private_folder() -> Path:
    """A new folder (mode 0700) for the server's socket, in a temporary folder no one else can
    rename it in: the runners send the server their environment, secrets included, and another
    user who could put a socket of theirs in its place would get it and their standard streams."""
    from eos import trusted
    from eos.errors import EnvironmentProblem

    base = Path(tempfile.gettempdir()).resolve()
    folder = Path(tempfile.mkdtemp(prefix="eos-forks-", dir=base))
    checks = [
        (base, trusted.why_untrusted(base, root_ok=True, sticky_ok=True)),
        (folder, trusted.why_untrusted(folder)),
    ]
    if os.lstat(folder).st_mode & 0o077:
        checks.append((folder, "can be read by others"))
    for where, problem in checks:
        if problem is not None:
            shutil.rmtree(folder, ignore_errors=True)
            raise EnvironmentProblem(
                f"the fork server's socket would live in {folder}, and {where} {problem}",
                hint=f"set TMPDIR to a folder only you (or root, with the sticky bit) can write, or {DISABLE_ENV}=1",
            )
    return folder


def _peer_is_me(conn: socket.socket) -> bool:
    """Whether the process at the other end runs as this user (Linux: SO_PEERCRED; elsewhere the
    socket's private folder is the only guard)."""
    cred = getattr(socket, "SO_PEERCRED", None)
    if cred is None:
        return True
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, cred, struct.calcsize("3i")))[1] == os.geteuid()


def _stop(proc: subprocess.Popen, folder: Path) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if proc.poll() is None:
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)


def request(path: str, message: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    """A control request to a server (`{"stats": true}`): its JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        body = json.dumps(message).encode()
        s.sendall(_HEADER.pack(len(body)) + body)
        size = _HEADER.unpack(_read(s, _HEADER.size))[0]
        return json.loads(_read(s, size))


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError(f"the peer closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A request: its JSON and the descriptors that came with it (none for control requests)."""
    fds = array.array("i")
    first, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if len(first) < _HEADER.size:
        first += _read(conn, _HEADER.size - len(first))
    size = _HEADER.unpack_from(first)[0]
    body = first[_HEADER.size :]
    if len(body) < size:
        body += _read(conn, size - len(body))
    return json.loads(body), list(fds)


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become the process the launcher would have started, and run it."""
    import runpy

    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):  # read at an interpreter's start: this one's was the server's
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(write_through=True)  # type: ignore[union-attr]
    # Entries Spark put on the runner's PYTHONPATH (its py-files, say) that this process lacks.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    module, args = request["argv"][1], request["argv"][2:]
    sys.argv = [module, *args]
    # The server imported the module to import what it imports; run it afresh as __main__, as
    # `python -m` would (runpy warns about a module found in sys.modules already).
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


def serve(path: str, allowed: tuple[str, ...] = (RUNNER_MODULE,)) -> None:
    """Fork the `allowed` modules on request until stdin ends."""
    for module in allowed:
        __import__(module)  # the slow part, once: PySpark, pyarrow, numpy
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    clients: dict[int, socket.socket] = {}  # child pid -> the client waiting for its status
    served = 0
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([listener, wake_r, stdin], [], [])
        if stdin in ready and not os.read(stdin, 4096):
            break  # the driver is gone
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(clients)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        if not _peer_is_me(conn):
            conn.close()  # another user: nothing is read from it, nothing forked for it
            continue
        try:
            message, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        if message.get("stats"):
            body = json.dumps({"served": served, "pid": os.getpid()}).encode()
            with contextlib.suppress(OSError):
                conn.sendall(_HEADER.pack(len(body)) + body)
            conn.close()
            continue
        argv = message.get("argv") or []
        if len(fds) != 3 or len(argv) < 2 or argv[0] != "-m" or argv[1] not in allowed:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(_STATUS.pack(0))  # refused: the client runs it itself
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            for other in clients.values():  # other children's clients: theirs to close
                other.close()
            for fd in (wake_r, wake_w):
                os.close(fd)
            code = _child(message, fds)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        served += 1
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(_STATUS.pack(pid))
            clients[pid] = conn
        except OSError:
            conn.close()  # the client is gone: its child answers to the JVM all the same
    listener.close()
    with contextlib.suppress(OSError):
        os.unlink(path)


def _reap(clients: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]) or (RUNNER_MODULE,))

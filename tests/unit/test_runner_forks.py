"""The fork server for PySpark's streaming source runners (eos.runnerforks), with real processes:
a server forks the module a client asks for, the child takes over the client's streams, working
directory, environment and arguments, and the client ends as the child does; without a server,
or for a module it does not serve, the client runs the module itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eos import runnerforks
from eos.paths import REPO_DIR

PROBE = "tests.apps.fork_probe"


def _start_server(path: str) -> subprocess.Popen:
    """A fork server serving the probe, as a driver starts one (stdin a pipe); once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "eos.runnerforks", path, PROBE], stdin=subprocess.PIPE, cwd=REPO_DIR)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.05)
    return proc


@pytest.fixture
def server(tmp_path: Path):
    path = str(tmp_path / "sock")
    proc = _start_server(path)
    yield path, proc
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(10)


def _client(socket_path: str | None, *args: str, cwd: Path, **popen) -> subprocess.Popen:
    """The launcher's client, as the launcher runs it."""
    env = {**os.environ, "PROBE": "passed", "PYTHONPATH": str(REPO_DIR)}
    env.pop(runnerforks.SOCKET_ENV, None)
    if socket_path is not None:
        env[runnerforks.SOCKET_ENV] = socket_path
    command = [sys.executable, "-S", "-I", "-c", runnerforks.CLIENT, "-m", *args]
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _seen(line: str) -> dict[str, str]:
    """What the probe printed on stdout: its `key=value` words."""
    return dict(item.split("=", 1) for item in line.split())


def _served(path: str) -> int:
    return runnerforks.request(path, {"stats": True})["served"]


def test_the_child_is_forked_by_the_server_and_becomes_the_clients_process(server, tmp_path):
    path, proc = server
    client = _client(path, PROBE, "3", "extra", cwd=tmp_path)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 3, (out, err)
    seen = _seen(out)
    assert seen["ppid"] == str(proc.pid), out  # forked by the server, not started anew
    assert seen["cwd"] == str(tmp_path) and seen["probe"] == "passed", out
    assert "argv=['3', 'extra']" in err
    assert _served(path) == 1


def test_a_signal_to_the_client_reaches_the_child(server, tmp_path):
    path, _ = server
    client = _client(path, PROBE, "0", "sleep", cwd=tmp_path)
    assert client.stdout is not None
    child = int(_seen(client.stdout.readline())["pid"])
    client.send_signal(signal.SIGTERM)  # as Spark stops a runner
    assert client.wait(30) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the child outlived its client's SIGTERM"
        time.sleep(0.05)


def test_without_a_server_the_client_runs_the_module_itself(tmp_path):
    client = _client(str(tmp_path / "no-such-socket"), PROBE, "4", cwd=tmp_path)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 4, (out, err)
    assert f"pid={client.pid} " in out  # the client became the module (exec), no fork


def test_a_module_the_server_does_not_serve_is_run_by_the_client(server, tmp_path):
    path, _ = server
    client = _client(path, "json.tool", "--help", cwd=tmp_path)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0 and "usage" in out.lower(), (out, err)
    assert _served(path) == 0


def test_the_server_ends_with_its_driver(tmp_path):
    path = str(tmp_path / "sock")
    proc = _start_server(path)
    assert proc.stdin is not None
    proc.stdin.close()  # what the driver's exit does to the pipe
    assert proc.wait(10) == 0
    assert not os.path.exists(path)

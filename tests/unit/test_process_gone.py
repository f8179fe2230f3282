"""`jvm.alive` says a process is gone only once it no longer holds anything: a daemon restarted
right after it relies on that to bind its old port. A JVM's main thread exits first (a zombie in
/proc) while its other threads still close its sockets; calling that "gone" made a restarted
NameNode find its own RPC port in use (CI, twice). Reproduced here with a Python process whose
main thread exits (pthread_exit) while another thread holds a listening socket."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from eos_ops import jvm

HOLDER = """
import ctypes, socket, sys, threading, time
sock = socket.socket(); sock.bind(("127.0.0.1", int(sys.argv[1]))); sock.listen()
def hold():
    time.sleep(float(sys.argv[2]))
    sock.close()
threading.Thread(target=hold).start()
print(__import__("os").getpid(), flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the main thread exits; the process lives on in hold()
"""
HOLD_S = 1.5


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def start_holder(port: int, as_child: bool) -> tuple[int, subprocess.Popen]:
    """The holder as our child, or as a grandchild whose parent has exited (not ours to reap)."""
    cmd = [sys.executable, "-c", HOLDER, str(port), str(HOLD_S)]
    if not as_child:
        cmd = ["sh", "-c", '"$@" &', "sh", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    return int(proc.stdout.readline()), proc


@pytest.mark.parametrize("as_child", [True, False], ids=["our child", "not our child"])
def test_a_process_whose_main_thread_exited_is_alive_while_it_holds_its_port(as_child: bool) -> None:
    port = jvm.free_ports(1)[0]
    pid, proc = start_holder(port, as_child)
    deadline = time.monotonic() + 5
    while state(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state(pid) == "Z", "the holder's main thread did not exit"
    assert not jvm.port_is_free("127.0.0.1", port)
    assert jvm.alive(pid), "called gone while its socket is still open"

    started = time.monotonic()
    while jvm.alive(pid) and time.monotonic() - started < 10:
        time.sleep(0.01)
    assert not jvm.alive(pid)
    assert jvm.port_is_free("127.0.0.1", port), "called gone before its port was free"
    proc.wait(5)

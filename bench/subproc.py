"""`python -m eos run` as a subprocess, with every output line time-stamped as it arrives.

Used where a run must be killed (recovery) or must run long on its own (memory). The process gets
a session of its own, so a failpoint's kill -9 of its process group never reaches the benchmark.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.env import REPO


class EosProcess:
    def __init__(self, pipeline_file: Path, *args: str, log: Path | None = None):
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eos", "run", str(pipeline_file), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._log = open(log, "w") if log else None  # noqa: SIM115 (closed when the output ends)
        self.exited_at: float | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            with self._changed:
                self.lines.append((now, line.rstrip("\n")))
                self._changed.notify_all()
            if self._log:
                self._log.write(f"{now - self.started:9.3f} {line}")
        self.proc.wait()
        with self._changed:
            self.exited_at = time.monotonic()
            self._changed.notify_all()
        if self._log:
            self._log.close()

    def first(self, pattern: str, timeout: float) -> float | None:
        """Monotonic time of the first line matching `pattern` (waits for it), or None."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for at, line in self.lines:
                    if regex.search(line):
                        return at
                if self.exited_at is not None or time.monotonic() > deadline:
                    return None
                self._changed.wait(0.5)

    def count(self, pattern: str) -> int:
        regex = re.compile(pattern)
        with self._changed:
            return sum(1 for _, line in self.lines if regex.search(line))

    def wait(self, timeout: float) -> float | None:
        """Monotonic time the process ended (its output closed), or None on timeout."""
        self._reader.join(timeout)
        return self.exited_at

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """Last resort: the whole session (driver, JVM) and nothing else."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, n: int = 30) -> str:
        with self._changed:
            return "\n".join(line for _, line in self.lines[-n:])


def wait_group_gone(pgid: int, timeout: float = 15.0) -> float:
    """After a kill -9, Spark's Python workers (a process group of their own) may linger a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return time.monotonic()


def committed_epochs(checkpoint: Path) -> int:
    """Epochs Spark marked committed in a checkpoint (files of its commit log)."""
    folder = checkpoint / "commits"
    return sum(1 for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else 0


def wait_committed(proc: EosProcess, checkpoint: Path, more_than: int, timeout: float) -> float | None:
    """time.monotonic() when the checkpoint's commit log first holds more than `more_than` epochs
    (polled every 20 ms; the commit log, not the progress lines, so it holds whatever eos prints),
    or None if the process ended or the time ran out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if committed_epochs(checkpoint) > more_than:
            return time.monotonic()
        if proc.proc.poll() is not None:
            return time.monotonic() if committed_epochs(checkpoint) > more_than else None
        time.sleep(0.02)
    return None

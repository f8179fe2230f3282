"""What Spark's driver JVM prints during a run: eos's log levels, and its stderr without the lines
nobody can act on.

Log levels: ops/spark/log4j2.properties (warnings and errors, without those eos reports itself
or that are normal). A JVM eos starts reads it from the start (spark.driver.extraJavaOptions,
eos.sparksession.default_conf). Under spark-submit the JVM ran before eos, with Spark's default
profile (everything from INFO up) unless the user configured log4j; eos then loads its file into
that JVM's log4j at run time (`use_eos_levels`), once the SparkContext has started: Spark loads
its default profile again as the context starts (`spark.log.level` WARN keeps that start short).
A logging configuration of the user's own is left as it is.

Stderr: the JVM also writes lines outside log4j that say nothing a user can act on:
- the JDK's "WARNING: Using incubator modules: jdk.incubator.vector", at every start (Spark's
  launcher adds the module, and no JVM flag silences the warning);
- a BrokenPipeError traceback from PySpark's worker daemon when the JVM hangs up on a worker
  that was done. eos's own daemon (eos.sparkdaemon) ends such workers quietly, but Spark starts
  the daemons of the Python data source's planning (lookup, create, plan the read) as
  `pyspark.daemon` whatever spark.python.daemon.module says, and relays their stderr to its own.
A JVM eos starts gets a pipe as its stderr (`filtered_stderr`, around the gateway's launch): a
thread of the driver forwards everything else to eos's stderr, line by line. A traceback is held
until its last line says what it was (at most half a second, then it is written as it is). Its
first line alone, with no frame (a worker killed while it wrote, when the JVM stops), is never
written: it says nothing anyone can act on.

Under spark-submit the JVM started before eos, with the user's stderr, and printed the
incubator warning already; the daemons' tracebacks are still to come. There eos points the JVM's
`System.err` at the same kind of pipe (`filter_system_err`, over py4j, before any Python data
source runs), and the thread writes what it keeps to the JVM's own stderr (Linux: through
/proc; elsewhere the JVM's stderr stays as it is).

If the driver dies first, the pipe has no reader left (no other process holds it: the read end
is never inherited), so the JVM's writes fail at once with EPIPE, which the JVM ignores (it does
not die of SIGPIPE), and it exits as before, when the gateway's stdin closes. If eos's own stderr
goes away (a closed pipe), the thread keeps reading and drops what it reads: the JVM never waits
on a full pipe.

The driver's own Python side has one such traceback: PySpark's accumulator server (a thread of
the driver that the JVM sends task results' accumulator updates to) prints "Exception occurred
during processing of request" and an EOFError when the JVM hangs up on it before the driver
closed it, which is how every stop that reaches the JVM ends (`quiet_accumulator_server`).

`eos -v` (EOS_SPARK_LOG=verbose) leaves all of it alone: Spark's own logging, every line.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eos.paths import ops_dir

# Whole lines the JVM writes outside log4j that no user can act on.
UNACTIONABLE_LINES = (re.compile(rb"WARNING: Using incubator modules: [\w.,]+\s*"),)
# A Python traceback on the JVM's stderr starts with one of these and ends with its first line that
# is not indented (the exception).
_TRACEBACK_STARTS = (b"Traceback (most recent call last):", b"PySpark daemon failed to flush the output")
# ...and is dropped when it is PySpark's daemon finding the JVM gone.
_DAEMON_FRAME = b"pyspark/daemon.py"
_HUNG_UP = re.compile(rb"(BrokenPipeError|ConnectionResetError)\b")
_MAX_HELD = 500  # lines: a traceback longer than this is written as it is
PAUSE_S = 0.5  # a held traceback (or a line without its newline) is written after this long a pause
SPARK_DEFAULT_PROFILE = "org/apache/spark/log4j2-defaults.properties"


def verbose() -> bool:
    return os.environ.get("EOS_SPARK_LOG") == "verbose"


def log_config_file() -> Path:
    return ops_dir() / "spark" / "log4j2.properties"


class LineFilter:
    """Decides, line by line (each with its newline), what the JVM's stderr shows."""

    def __init__(self) -> None:
        self._held: list[bytes] = []

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def _header_only(self) -> bool:
        """What is held is a traceback's first line(s) without a frame: its writer was killed
        before it wrote more (PySpark's workers are, when the JVM stops). It says nothing anyone can
        act on, and is dropped when a line that is not one of its frames comes, or at the end."""
        return all(line.startswith(_TRACEBACK_STARTS) for line in self._held)

    def feed(self, line: bytes) -> list[bytes]:
        """The lines to write now (none while a traceback is held)."""
        if self._held:
            if line.startswith(b"  ") or line.startswith(_TRACEBACK_STARTS):
                self._held.append(line)
                return self.flush() if len(self._held) > _MAX_HELD else []
            if self._header_only():
                self._held = []
                return self.feed(line)
            block, self._held = [*self._held, line], []
            daemon_hung_up = _HUNG_UP.match(line) is not None and any(_DAEMON_FRAME in held for held in block)
            return [] if daemon_hung_up else block
        if line.startswith(_TRACEBACK_STARTS):
            self._held = [line]
            return []
        if any(pattern.fullmatch(line) for pattern in UNACTIONABLE_LINES):
            return []
        return [line]

    def flush(self, end: bool = False) -> list[bytes]:
        """What is held, as it is: at a pause, or at the end of the stream. A header alone stays
        held at a pause (its frames may still come) and goes at the end."""
        if self._header_only():
            if end:
                self._held = []
            return []
        held, self._held = self._held, []
        return held


def _forward(read_fd: int, out_fd: int) -> None:
    """Read the JVM's stderr until every writer has closed it; write what the filter lets through."""
    lines = LineFilter()
    partial = b""
    broken = False

    def write(chunks: list[bytes]) -> None:
        nonlocal broken
        data = b"".join(chunks)
        while data and not broken:
            try:
                data = data[os.write(out_fd, data) :]
            except InterruptedError:
                continue
            except OSError:  # eos's stderr went away: keep draining the pipe, write nothing
                broken = True

    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    try:
        while True:
            waiting = lines.holding or partial
            if not poller.poll(PAUSE_S * 1000 if waiting else None):
                write([*lines.flush(), partial])
                partial = b""
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                write([*lines.flush(end=True), partial])
                return
            *complete, partial = (partial + chunk).split(b"\n")
            for line in complete:
                write(lines.feed(line + b"\n"))
    finally:
        os.close(read_fd)
        os.close(out_fd)


def _start_filter(out_fd: int) -> int:
    """A pipe whose lines the filter thread writes to `out_fd` (it owns it); returns the write end
    (not inheritable: no child process ever holds the read end)."""
    read_fd, write_fd = os.pipe()
    threading.Thread(target=_forward, args=(read_fd, out_fd), name="eos-spark-stderr", daemon=True).start()
    return write_fd


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """While the body runs, this process's fd 2 is a pipe to a filtering thread (see the module
    doc); a process started meanwhile (the gateway JVM) keeps the pipe as its stderr for life."""
    sys.stderr.flush()
    write_fd = _start_filter(os.dup(2))  # to the stderr of this moment, for the JVM's life
    saved = os.dup(2)
    os.dup2(write_fd, 2)  # inheritable: the JVM's stderr
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def use_eos_levels(jvm: Any) -> bool:
    """In a JVM eos did not start (spark-submit's): load eos's log4j file if the JVM runs Spark's
    default profile; leave a configuration of the user's own alone. Returns whether it loaded."""
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    source = context.getConfiguration().getConfigurationSource()
    location = str(source.getLocation() or "")
    if not location.endswith(SPARK_DEFAULT_PROFILE):
        return False
    context.setConfigLocation(jvm.java.net.URI(log_config_file().as_uri()))
    return True


def quiet_accumulator_server(context: Any) -> None:
    """PySpark's accumulator server of `context` (a socketserver) ends a connection the JVM closed
    without printing its traceback; any other error it reports as before."""
    server = getattr(context, "_accumulatorServer", None)
    if server is None:
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):  # called inside `except`
            report(request, client_address)

    server.handle_error = handle_error


def filter_system_err(jvm: Any) -> bool:
    """In a JVM eos did not start (spark-submit's), on Linux: `System.err` through the filter, to
    the JVM's own stderr. Returns whether it could."""
    own_stderr = f"/proc/{jvm.java.lang.ProcessHandle.current().pid()}/fd/2"
    try:
        out_fd = os.open(own_stderr, os.O_WRONLY | os.O_APPEND)  # append: a file keeps what it has
    except OSError:
        return False
    write_fd = _start_filter(out_fd)
    try:
        stream = jvm.java.io.FileOutputStream(f"/proc/{os.getpid()}/fd/{write_fd}")
        jvm.java.lang.System.setErr(jvm.java.io.PrintStream(stream, True))
    except Exception:
        os.close(write_fd)  # the thread ends, and closes out_fd
        return False
    os.close(write_fd)  # the JVM opened its own
    return True

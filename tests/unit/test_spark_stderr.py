"""The filter on the stderr of the JVM eos starts (eos.sparklog): which lines it drops, which it
keeps, and that it never holds a line for long. The texts are what real runs printed."""

from __future__ import annotations

import os
import threading
import time

from eos.sparklog import PAUSE_S, LineFilter, _forward

INCUBATOR = b"WARNING: Using incubator modules: jdk.incubator.vector\n"
# PySpark's planner daemon (pyspark.daemon, from the installed package, and from the zip as under
# spark-submit) finding that the JVM hung up.
DAEMON_HUNG_UP = (
    b"Traceback (most recent call last):\n"
    b'  File "/venv/lib/python3.11/site-packages/pyspark/daemon.py", line 264, in manager\n'
    b"    code = worker(sock, authenticated)\n"
    b"           ^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    b'  File "/venv/lib/python3.11/site-packages/pyspark/daemon.py", line 95, in worker\n'
    b"    outfile.flush()\n"
    b"BrokenPipeError: [Errno 32] Broken pipe\n"
)
FROM_ZIP = (
    b"Traceback (most recent call last):\n"
    b'  File "/spark/python/lib/pyspark.zip/pyspark/daemon.py", line 264, in manager\n'
    b'  File "/spark/python/lib/pyspark.zip/pyspark/daemon.py", line 95, in worker\n'
    b"BrokenPipeError: [Errno 32] Broken pipe\n"
)
NOT_FLUSHED = b"PySpark daemon failed to flush the output to the worker process:\n" + FROM_ZIP.replace(
    b"BrokenPipeError", b"ConnectionResetError"
)
# A worker's real failure, and a broken pipe somewhere else: both are shown.
USER_ERROR = (
    b"Traceback (most recent call last):\n"
    b'  File "/app/mytransforms.py", line 3, in parse\n'
    b"    return int(value)\n"
    b"ValueError: invalid literal for int() with base 10: 'x'\n"
)
OTHER_PIPE = b"Traceback (most recent call last):\n" + b'  File "/app/x.py", line 1, in f\n' + FROM_ZIP[-40:]
SPARK_LINE = b"26/11/27 10:45:59 WARN SparkContext: something worth reading\n"
JAVA_TRACE = b"java.io.IOException: boom\n\tat org.apache.spark.Foo.bar(Foo.scala:1)\n"


def lines(text: bytes) -> list[bytes]:
    return text.splitlines(keepends=True)


def filtered(text: bytes) -> bytes:
    f = LineFilter()
    out = [kept for line in lines(text) for kept in f.feed(line)]
    return b"".join(out + f.flush())


def test_unactionable_lines_go_and_everything_else_stays():
    assert filtered(INCUBATOR) == b""
    assert filtered(DAEMON_HUNG_UP) == b"" == filtered(FROM_ZIP) == filtered(NOT_FLUSHED)
    for kept in (USER_ERROR, OTHER_PIPE, SPARK_LINE, JAVA_TRACE, b"WARNING: something else\n"):
        assert filtered(kept) == kept
    # Interleaved as the JVM relays them, in any order: only the unactionable parts go.
    mixed = SPARK_LINE + DAEMON_HUNG_UP + USER_ERROR + INCUBATOR + JAVA_TRACE + FROM_ZIP + SPARK_LINE
    assert filtered(mixed) == SPARK_LINE + USER_ERROR + JAVA_TRACE + SPARK_LINE


def test_a_held_traceback_is_written_when_cut_off():
    f = LineFilter()
    head = lines(DAEMON_HUNG_UP)[:3]
    assert [kept for line in head for kept in f.feed(line)] == [] and f.holding
    assert b"".join(f.flush()) == b"".join(head)  # at a pause or the end: as it was, nothing lost


def test_a_traceback_header_whose_writer_was_killed_is_dropped():
    """A worker killed right after `Traceback (most recent call last):` (the JVM stopping): the
    header alone is held at a pause, and dropped when the next line is not one of its frames or the
    stream ends; a header whose frames come after a pause is shown whole."""
    header = b"Traceback (most recent call last):\n"
    f = LineFilter()
    assert f.feed(header) == [] and f.flush() == [] and f.holding  # a pause: still held
    assert f.feed(SPARK_LINE) == [SPARK_LINE] and not f.holding
    assert f.feed(header) == [] and f.flush(end=True) == [] and not f.holding
    slow = lines(USER_ERROR)
    assert slow[0] == header
    f = LineFilter()
    assert f.feed(slow[0]) == [] and f.flush() == []
    assert b"".join(kept for line in slow[1:] for kept in f.feed(line)) == USER_ERROR


def test_the_thread_forwards_at_once_and_writes_what_is_held_after_a_pause():
    """Through a real pipe: a line is forwarded as soon as it is complete; a traceback cut off
    (the JVM stopped writing) appears after the pause; every byte of a kept line arrives."""
    jvm_r, jvm_w = os.pipe()
    out_r, out_w = os.pipe()
    forwarding = threading.Thread(target=_forward, args=(jvm_r, out_w), daemon=True)
    forwarding.start()
    os.write(jvm_w, INCUBATOR + SPARK_LINE)
    assert os.read(out_r, 4096) == SPARK_LINE
    started = time.monotonic()
    os.write(jvm_w, b'Traceback (most recent call last):\n  File "/x/pyspark/daemon.py", line 1\n')
    shown = os.read(out_r, 4096)
    assert shown.startswith(b"Traceback") and PAUSE_S * 0.8 <= time.monotonic() - started < PAUSE_S + 5
    os.write(jvm_w, b"a line without its newline")
    assert os.read(out_r, 4096) == b"a line without its newline"
    os.close(jvm_w)  # the JVM is gone: the thread ends and closes both ends
    forwarding.join(5)
    assert not forwarding.is_alive() and os.read(out_r, 4096) == b""


def test_a_closed_stderr_never_blocks_the_jvm():
    """eos's stderr goes away (a closed pipe): the thread keeps draining the JVM's pipe."""
    jvm_r, jvm_w = os.pipe()
    out_r, out_w = os.pipe()
    os.close(out_r)
    forwarding = threading.Thread(target=_forward, args=(jvm_r, out_w), daemon=True)
    forwarding.start()
    os.set_blocking(jvm_w, False)
    deadline = time.monotonic() + 10
    written = 0
    while written < 4 * 1024 * 1024:  # 64 times what the pipe holds
        try:
            written += os.write(jvm_w, SPARK_LINE * 1000)
        except BlockingIOError:  # full for now: the thread must empty it
            assert time.monotonic() < deadline, f"the pipe stayed full after {written} bytes"
            time.sleep(0.01)
    os.close(jvm_w)
    forwarding.join(5)
    assert not forwarding.is_alive()


def test_the_accumulator_server_ends_a_closed_connection_quietly(capfd):
    """PySpark's accumulator server (real, on loopback): a JVM that hangs up mid-message printed
    "Exception occurred during processing of request" and an EOFError traceback; quiet, it does
    not, and still reports any other error."""
    import socket
    from types import SimpleNamespace

    from pyspark.accumulators import _start_update_server

    from eos.sparklog import quiet_accumulator_server

    def hang_up(server, message: bytes) -> str:
        with socket.create_connection(server.server_address[:2]) as conn:
            conn.sendall(message)
        time.sleep(1.5)  # the server polls its connections every second
        return capfd.readouterr().err

    token = "t" * 16
    loud = _start_update_server(token, False)
    quiet = _start_update_server(token, False)
    try:
        assert "EOFError" in hang_up(loud, token.encode())  # authenticated, then nothing: EOF
        quiet_accumulator_server(SimpleNamespace(_accumulatorServer=quiet))
        assert hang_up(quiet, token.encode()) == ""
        assert "ValueError" in hang_up(quiet, b"x" * 16)  # a wrong token is still reported
    finally:
        for server in (loud, quiet):
            server.server_shutdown = True
            server.shutdown()
            server.server_close()

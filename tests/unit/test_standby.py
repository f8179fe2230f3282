"""The standby's watch (eos.standby.watch): when the recorded driver is gone, and which driver it
watches. Real vote services and sockets answer the pings; the control log is in memory (only what
the watch reads). Spark, Kafka and the take-over itself: tests/faults/test_standby.py."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from eos import standby
from eos.protocol.channel import Liveness, ping
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState, Decision, DriverInfo, Pool

PIPELINE = "orders"


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    """The watch's timings, scaled down (the logic is what is tested here)."""
    monkeypatch.setattr(standby, "PING_INTERVAL_S", 0.05)
    monkeypatch.setattr(standby, "PING_TIMEOUT_S", 0.3)
    monkeypatch.setattr(standby, "RETRY_S", 0.01)
    monkeypatch.setattr(standby, "READ_TIMEOUT_S", 0.3)


class Recorded(ControlLog):
    """A control log in memory whose recorded driver the test changes; counts the reads."""

    def __init__(self, driver: DriverInfo | None, read_s: float = 0.0):
        self.driver, self.read_s, self.reads = driver, read_s, 0

    def state(self) -> ControlState:
        self.reads += 1
        time.sleep(self.read_s)
        return ControlState(previous=self.driver)

    def take_over(self, driver: DriverInfo) -> ControlState:
        raise AssertionError("a standby that watches writes nothing")

    def record_decision(self, decision: Decision) -> None:
        raise AssertionError("a standby that watches writes nothing")

    def record_pools(self, pools: dict[str, Pool]) -> None:
        raise AssertionError("a standby that watches writes nothing")

    def reset(self) -> None:
        raise AssertionError("a standby that watches writes nothing")


def driver_of(service: Coordinator, run: str) -> DriverInfo:
    return DriverInfo(run, socket.gethostname(), os.getpid(), service.address.hostport, pipeline=PIPELINE,
                      ping_key=service.ping_key)  # fmt: skip


def running(run: str) -> Coordinator:
    return Coordinator(identity={"pipeline": PIPELINE, "run": run})


def watch_on_thread(control: ControlLog, stop: threading.Event, said: list[str], **kwargs):
    result: dict[str, object] = {}

    def target() -> None:
        result["gone"] = standby.watch(control, said.append, stop, **kwargs)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_a_driver_that_answers_is_watched_until_told_to_stop():
    service = running("a1a1a1a1a1a1")
    try:
        control, stop, said = Recorded(driver_of(service, "a1a1a1a1a1a1")), threading.Event(), []
        thread, result = watch_on_thread(control, stop, said)
        time.sleep(1.0)
        assert thread.is_alive(), said  # 1 s of answers: still watching
        assert control.reads == 1  # the control log is read when it begins watching, not with every ping
        stop.set()
        thread.join(2)
        assert result["gone"] is None
        assert said == [f"standing by: watching the driver pid {os.getpid()} on {socket.gethostname()} (run "
                        f"a1a1a1a1a1a1, vote service {service.address.hostport})"]  # fmt: skip
    finally:
        service.close()


def test_a_killed_driver_is_gone_after_a_few_refusals():
    """A dead process's port refuses at once: gone after MISSES refusals, RETRY_S apart, and one
    more read of the control log (it is still the recorded driver)."""
    service = running("b2b2b2b2b2b2")
    control, stop, said = Recorded(driver_of(service, "b2b2b2b2b2b2")), threading.Event(), []
    thread, result = watch_on_thread(control, stop, said)
    time.sleep(0.3)
    service.close()
    closed = time.monotonic()
    thread.join(5)
    gone = result["gone"]
    assert isinstance(gone, standby.Gone) and gone.driver == control.driver
    assert "3 pings in a row failed" in gone.why and "nothing answers" in gone.why, gone.why
    assert result["at"] - closed < standby.PING_INTERVAL_S + 3 * standby.RETRY_S + 0.5


def test_a_stalled_driver_is_gone_after_misses_in_a_row_that_each_time_out():
    """A stopped process (SIGSTOP) still has the kernel accept its connections, and never answers:
    each ping waits PING_TIMEOUT_S, and MISSES of them in a row make the driver gone."""
    listener = socket.create_server(("127.0.0.1", 0))  # accepts in the kernel, never answers
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        stalled = DriverInfo("c3c3c3c3c3c3", "h", 1, address, pipeline=PIPELINE, ping_key="k" * 64)
        assert ping(stalled, 0.2) is Liveness.SILENT
        control, stop, said = Recorded(stalled), threading.Event(), []
        started = time.monotonic()
        gone = standby.watch(control, said.append, stop)
        took = time.monotonic() - started
        assert isinstance(gone, standby.Gone) and "(the last: nothing answers, after 0.3" in gone.why, gone
        assert 3 * standby.PING_TIMEOUT_S <= took < 3 * standby.PING_TIMEOUT_S + 1.0
    finally:
        listener.close()


def test_misses_count_only_in_a_row():
    """Two failed pings, then an answer: not gone (a pause shorter than MISSES pings)."""
    answers = iter([Liveness.SILENT, Liveness.SILENT, Liveness.ALIVE] * 5)
    stop, said = threading.Event(), []
    driver = DriverInfo("d4d4d4d4d4d4", "h", 1, "127.0.0.1:1", pipeline=PIPELINE)

    def liveness(_driver: DriverInfo, _timeout: float) -> Liveness:
        try:
            return next(answers)
        except StopIteration:
            stop.set()
            return Liveness.ALIVE

    assert standby.watch(Recorded(driver), said.append, stop, liveness) is None


def test_a_standby_watches_the_driver_that_took_over_instead_of_taking_over():
    """The watched driver stops answering, but another driver (a standby faster than this one)
    is recorded by now: this standby watches that one, and does not take over."""
    first, second = running("e5e5e5e5e5e5"), running("f6f6f6f6f6f6")
    try:
        control, stop, said = Recorded(driver_of(first, "e5e5e5e5e5e5")), threading.Event(), []
        thread, result = watch_on_thread(control, stop, said)
        time.sleep(0.2)
        control.driver = driver_of(second, "f6f6f6f6f6f6")  # the other standby took over ...
        first.close()  # ... and the first driver is gone
        time.sleep(1.0)
        assert thread.is_alive(), result
        assert any("the pipeline's driver changed: now watching" in line and "f6f6f6f6f6f6" in line for line in said)
        second.close()  # now the one it watches is gone too
        thread.join(5)
        assert result["gone"] == standby.Gone(control.driver, result["gone"].why)
    finally:
        first.close()
        second.close()


def test_a_control_log_read_that_hangs_does_not_hold_the_take_over():
    """A driver that stalled inside a write to the control log holds a transaction open there, and
    a read waits for it: the standby does not wait for such a read (fencing ends the transaction)."""
    driver = DriverInfo("a7a7a7a7a7a7", "h", 1, "127.0.0.1:1", pipeline=PIPELINE)
    control, said = Recorded(driver), []

    def refused(_driver: DriverInfo, _timeout: float) -> Liveness:
        control.read_s = 3  # every read from now on hangs (for 10 times READ_TIMEOUT_S)
        return Liveness.SILENT

    started = time.monotonic()
    gone = standby.watch(control, said.append, threading.Event(), refused)
    gone_at = time.monotonic() - started
    assert isinstance(gone, standby.Gone) and gone.driver == driver
    assert gone_at < standby.READ_TIMEOUT_S + 1.0


def test_with_no_driver_recorded_the_standby_takes_over_at_once():
    gone = standby.watch(Recorded(None), [].append, threading.Event())
    assert gone == standby.Gone(None, "no driver is recorded for this pipeline")

"""Progress for people: the phase tracker against a real coordinator (real votes over TCP), the
live line on a real pseudo-terminal, and the plain lines anywhere else."""

from __future__ import annotations

import io
import os
import re
import threading
import time

from eos.observe.progress import ProgressPrinter
from eos.observe.tracker import AGREEMENT, BETWEEN, COMMIT, MARK_COMMITTED, RECOVERING, SINK_JOB, EpochTracker
from eos.protocol.committer import EpochReport, RecoveryReport
from eos.protocol.coordinator import Coordinator, VoteClient
from eos_connectors.kafka.ledger import LedgerEntry


def report(epoch: int, out: int = 500, **extra) -> EpochReport:
    values = dict(
        epoch=epoch, attempts=1, records_out={"out": out}, replay_skipped={}, skipped_slots=0, counted_only={},
        job_s=0.5, read_process_s=0.2, precommit_s=0.1, vote_wait_s=0.02, agreement_s=0.001, commit_s=0.03,
    )  # fmt: skip
    values.update(extra)
    return EpochReport(**values)


def progress(epoch: int, rows: int = 500) -> dict:
    return {
        "runId": "run", "batchId": epoch, "numInputRows": rows,
        "durationMs": {"latestOffset": 2, "walCommit": 30, "queryPlanning": 40, "getBatch": 1, "commitOffsets": 9,
                       "triggerExecution": 1000},
    }  # fmt: skip


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_tracker_follows_the_protocol_through_the_coordinator():
    coordinator = Coordinator(bind_host="127.0.0.1")
    try:
        tracker = EpochTracker(slots=2, coordinator=coordinator)
        assert tracker.phase().name == BETWEEN and tracker.oldest_open_transaction_s() == 0
        coordinator.open_attempt(7, 1, range(2), timeout_s=30)
        tracker.on_epoch_start(7, 1)
        assert tracker.phase().name == SINK_JOB
        decisions: list[str] = []
        voters = [VoteClient(coordinator.address, 7, 1, slot, 30) for slot in range(2)]
        first = threading.Thread(target=lambda: decisions.append(voters[0].vote_prepared({})[0]))
        first.start()
        wait_for(lambda: tracker.phase().name == AGREEMENT)
        assert tracker.phase().votes == 1 and "agreement 1/2" in tracker.phase().describe()
        decisions.append(voters[1].vote_prepared({})[0])
        first.join(10)
        assert decisions == ["commit", "commit"]
        assert tracker.phase().name == COMMIT and tracker.phase().votes == 0
        voters[0].report_committed()
        wait_for(lambda: tracker.phase().votes == 1)
        assert tracker.oldest_open_transaction_s() > 0  # open since the attempt started
        tracker.on_epoch_committed(report(7))
        assert tracker.phase().name == MARK_COMMITTED and tracker.oldest_open_transaction_s() == 0
        tracker.on_spark_progress(progress(7))
        assert tracker.phase().name == BETWEEN

        # A failed attempt: its transactions count as open until the recovery has fenced them.
        tracker.on_epoch_start(8, 1)
        tracker.on_epoch_aborted(8, 1, "boom", True)
        assert tracker.phase().name == RECOVERING and tracker.oldest_open_transaction_s() > 0
        tracker.on_recovery(RecoveryReport(2, 0.05, {}, "epoch 8 attempt 1 failed"))
        assert tracker.oldest_open_transaction_s() == 0
        for voter in voters:
            voter.close()
    finally:
        coordinator.close()


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    printer = ProgressPrinter("p", out, tracker=EpochTracker(2))
    printer.on_recovery(RecoveryReport(2, 0.012, {("out", 0): LedgerEntry("p", "out", 0, 4, "c")}, "start-up"))
    printer.on_epoch_start(5, 1)
    printer.on_epoch_committed(report(5, skipped_slots=1, replay_skipped={"out": 10}))
    printer.on_spark_progress(progress(5))
    printer.on_epoch_aborted(6, 1, "slot 1 failed", True)
    printer.on_epoch_committed(report(6, attempts=2))
    printer.flush()  # epoch 6's Spark progress never came: printed anyway
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue(), "no terminal control codes in a log file"
    assert lines[0] == "[p] recovery (start-up): fenced 2 transactional ids in 12.0ms; ledger: out/0:4"
    assert re.fullmatch(
        r"\[p\] epoch 5 committed \| in 500 \| out 500 \| 500 rec/s \| plan 73ms read\+process 200ms "
        r"pre-commit 100ms agree 1.0ms \(wait 20.0ms\) commit 30.0ms mark 9ms "
        r"\| replay: 1 slot\(s\) already committed, skipped",
        lines[1],
    ), lines[1]
    assert lines[2] == "[p] epoch 6 attempt 1 ABORTED: slot 1 failed; retrying after fencing"
    assert lines[3].startswith("[p] epoch 6 committed | in ? | out 500") and lines[3].endswith("| attempts 2")


def test_live_line_on_a_terminal():
    master, replica = os.openpty()
    terminal = os.fdopen(replica, "w")
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: _drain(master, chunks), daemon=True)
    reader.start()
    try:
        tracker = EpochTracker(2)
        printer = ProgressPrinter("p", terminal, tracker=tracker)  # live: detected from the tty
        tracker.on_epoch_start(3, 1)
        printer.on_epoch_start(3, 1)
        wait_for(lambda: b"[p] epoch 3: read+process+pre-commit" in b"".join(chunks))
        tracker.on_epoch_committed(report(3))
        printer.on_epoch_committed(report(3))
        printer.on_spark_progress(progress(3))
        tracker.on_spark_progress(progress(3))
        wait_for(lambda: b"waiting for the next epoch" in b"".join(chunks))
        printer.flush()
        terminal.flush()
        wait_for(lambda: b"epoch 3 committed | in 500" in b"".join(chunks))
    finally:
        terminal.close()
        reader.join(5)
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[" in text, "a live display moves the cursor"
    assert "last: epoch 3, 500 out" in text


def _drain(fd: int, chunks: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            return
        if not data:
            return
        chunks.append(data)

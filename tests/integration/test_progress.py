"""Progress for people: the phase tracker against a real coordinator (real votes over TCP), the
lines of a real run (compared with what the broker holds), the live line on a real
pseudo-terminal, and the plain lines anywhere else."""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time

from eos.observe.progress import ProgressPrinter, RunRate, age, lag_text, outputs
from eos.observe.tracker import BETWEEN, COMMIT, DECIDE, MARK_COMMITTED, RECOVERING, WRITE, EpochTracker
from eos.protocol.channel import VoteClient
from eos.protocol.coordinator import Coordinator
from eos.protocol.ledger import LedgerEntry
from eos.protocol.report import EpochReport, RecoveryReport, SinkWork, SlotReport
from eos.protocol.sink import Prepared
from tests.pipelines import (
    assert_exactly_once,
    committed_values,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)
from tests.support import read_all


def slot(n: int, reused: bool, records: int = 250) -> SlotReport:
    prepared = Prepared("out", n, f"eos/p/out/{n}", records)
    return SlotReport(n, 0, "w", "h", 1, {"out": SinkWork(records, 0, prepared, True, 0.0 if reused else 0.05, reused)})


def report(epoch: int, out: int = 500, **extra) -> EpochReport:
    values = dict(
        epoch=epoch, attempts=1, records_out={"out": out}, replay_skipped={}, skipped_slots=0, counted_only={},
        job_s=0.5, decide_s=0.004, commit_s=0.03, slots=[slot(0, True), slot(1, False)], txn_commits=2,
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
        tracker = EpochTracker(coordinator=coordinator)
        assert tracker.phase().name == BETWEEN and tracker.oldest_open_transaction_s() == 0
        coordinator.open_attempt(7, 1, timeout_s=30)
        tracker.on_epoch_start(7, 1)
        assert tracker.phase().name == WRITE and tracker.phase().prepared == 0
        # A slot pre-committed and votes prepared; its thread waits for the decision.
        voter = VoteClient(coordinator.address, 7, 1, 30)  # it votes with the id it leased on its connection
        lease = voter.request("lease", sink="out", slot=0, worker="w", idle=[])["number"]
        vote = {"sink": "out", "handle": "eos/p/out/0", "slot": 0, "task_attempt": 0, "lease": lease}
        decisions: list[dict] = []
        waiting = threading.Thread(target=lambda: decisions.append(voter.request("prepared", **vote)))
        waiting.start()
        wait_for(lambda: tracker.phase().prepared == 1)
        assert "epoch 7: read+write+pre-commit, 1 prepared" in tracker.phase().describe()
        tracker.on_phase(7, 1, DECIDE)
        assert tracker.phase().name == DECIDE
        tracker.on_phase(7, 1, COMMIT)
        assert "commit 0/1" in tracker.phase().describe()
        coordinator.release(7, 1, [("out", "eos/p/out/0")])
        waiting.join(10)
        assert decisions and decisions[0]["decision"] == "commit"
        voter.request("committed", **vote)
        wait_for(lambda: tracker.phase().committed == 1)
        assert "commit 1/1" in tracker.phase().describe()
        assert tracker.oldest_open_transaction_s() > 0  # open since the attempt started
        tracker.on_epoch_committed(report(7))
        assert tracker.phase().name == MARK_COMMITTED and tracker.oldest_open_transaction_s() == 0
        tracker.on_spark_progress(progress(7))
        assert tracker.phase().name == BETWEEN
        voter.close()

        # A failed attempt: its transactions count as open until the recovery has fenced them.
        tracker.on_epoch_start(8, 1)
        tracker.on_epoch_aborted(8, 1, "boom", True)
        assert tracker.phase().name == RECOVERING and tracker.oldest_open_transaction_s() > 0
        tracker.on_recovery(RecoveryReport(2, {}, 0.05, {}, "epoch 8 attempt 1 failed"))
        assert tracker.oldest_open_transaction_s() == 0
    finally:
        coordinator.close()


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    printer = ProgressPrinter("p", out, tracker=EpochTracker())
    entry = LedgerEntry("p", "out", 0, 4, "c", "o", "g")
    printer.on_recovery(RecoveryReport(2, {"committed": 1}, 0.012, {("out", 0): entry}, "start-up"))
    printer.on_epoch_start(5, 1)
    printer.on_epoch_committed(report(5, skipped_slots=1, replay_skipped={"out": 10}))
    printer.on_spark_progress(progress(5))
    printer.on_epoch_committed(report(6, records_out={"out": 490, "events.dlq": 10}))
    printer.on_spark_progress(progress(6))
    printer.on_epoch_aborted(7, 1, "slot 1 failed", True)
    printer.on_epoch_committed(report(7, attempts=2))
    printer.flush()  # epoch 7's Spark progress never came: printed anyway
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue(), "no terminal control codes in a log file"
    assert (
        lines[0]
        == "[p] recovery (start-up): fenced 2 transactional ids, resolved 1 committed in 12.0ms; ledger: out/0:4"
    )
    # The run's first epoch started the Python workers and planned the query: no rate.
    assert re.fullmatch(
        r"\[p\] epoch 5 committed \| in 500 \| out: out 500 \| first epoch of the run: also starts the Python "
        r"workers and plans the query, no rate \| plan 73ms job 500ms decide 4.0ms "
        r"commit 30.0ms mark 9ms \| 2 slots, 2 txns \(1 producers reused\) "
        r"\| replay: 1 slot\(s\) already committed, skipped",
        lines[1],
    ), lines[1]
    # Records out per sink, then the dead-letter queue.
    assert lines[2].startswith("[p] epoch 6 committed | in 500 | out: out 490, dlq 10 | 500 rec/s | plan 73ms")
    assert lines[3] == "[p] epoch 7 attempt 1 ABORTED: slot 1 failed; retrying after fencing"
    # A sink seen before shows 0 when an epoch wrote nothing to it.
    assert lines[4].startswith("[p] epoch 7 committed | in ? | out: out 500, dlq 0 | 1,000 rec/s")
    assert lines[4].endswith("| attempts 2")


def test_outputs_and_lag_ages():
    assert outputs({"totals": 12, "totals_pg": 12, "orders.dlq": 3}) == "totals 12, totals_pg 12, dlq 3"
    assert outputs({"a.dlq": 2, "t": 1_000, "b.dlq": 0}) == "t 1,000, dlq a 2, dlq b 0"
    assert outputs({"t": 0}, sinks=["t", "u"]) == "t 0, u 0"
    assert [age(s) for s in (0.04, 9.96, 42.4, 185, 7_830)] == ["0.0s", "10.0s", "42s", "3m05s", "2h10m"]
    assert lag_text(1_200, 4.21) == " | lag 1,200 (oldest 4.2s)"
    assert lag_text(0, 0.0) == " | lag 0" and lag_text(5, None) == " | lag 5" and lag_text(None, 3.0) == ""


def test_the_rate_after_start_up_leaves_the_first_epoch_out():
    rate = RunRate()
    line = {"t": {"0": 0, "1": 0}}
    for epoch, ms in ((3, 30_000), (4, 1_000), (5, 3_000)):
        rate.on_epoch_committed(report(epoch))
        end = {"t": {"0": line["t"]["0"] + 100, "1": line["t"]["1"] + 300}}
        scan = {"startOffset": json.dumps(line), "endOffset": json.dumps(end), "numInputRows": 400}
        # Two scans of one source (its poison scan) report the same range: counted once.
        rate.on_spark_progress({**progress(epoch), "sources": [scan, scan], "durationMs": {"triggerExecution": ms}})
        line = end
    rate.on_spark_progress({**progress(6), "durationMs": {"triggerExecution": 5}})  # no epoch 6 committed
    assert rate.describe() == "after start-up 800 records in 2 epochs, 4.0 s: 200 rec/s"
    one = RunRate()
    one.on_epoch_committed(report(0))
    one.on_spark_progress(progress(0))
    assert one.describe() is None


LINE = re.compile(
    r"\[(?P<name>[^\]]+)\] epoch (?P<epoch>\d+) committed \| in (?P<in>[\d,]+) \| out: out (?P<out>[\d,]+) \| "
    r"(?P<rate>[\d,]+ rec/s|first epoch of the run: [^|]+) \| "
    r"plan \d+ms job [\d.]+ms decide [\d.]+ms commit [\d.]+ms mark \d+ms \| (?P<slots>\d+) slots, (?P<txns>\d+) txns "
    r"\((?P<reused>\d+) producers reused\) \| lag (?P<lag>[\d,]+)(?: \(oldest (?P<oldest>[\d.]+)s\))?(?P<extra>.*)"
)


def test_lines_of_a_real_run_match_what_it_committed(spark, bootstrap, new_topic, unique_name, tmp_path, capsys):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 600)
    produced = time.time()
    name = unique_name("p")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=400)
    path = write_pipeline(tmp_path, config)
    result = run_in_process(
        spark, path, progress=True, failpoints=["sink.after_precommit=raise@epoch=1,slot=0,attempt=1"]
    )
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"[{name}]")]
    text = "\n".join(lines)
    assert lines[0].startswith(f"[{name}] recovery (first start): fenced 0 transactional ids"), text
    epochs = [m for m in (LINE.fullmatch(line) for line in lines) if m]
    assert [int(m["epoch"]) for m in epochs] == list(range(result.epochs_committed)) == [0, 1], text
    # in and out are what each epoch read and committed; lag is what was left after it.
    assert [(int(m["in"]), int(m["out"]), int(m["lag"].replace(",", ""))) for m in epochs] == [
        (400, 400, 200),
        (200, 200, 0),
    ]
    # The first epoch of the run shows no rate (it includes the start-up); the next one does.
    assert epochs[0]["rate"].startswith("first epoch of the run") and epochs[1]["rate"].endswith(" rec/s")
    # The lag in event time: the 200 records left after epoch 0 were produced before the run.
    assert epochs[0]["oldest"] is not None, text
    assert 0 <= float(epochs[0]["oldest"]) <= time.time() - produced + 1, text
    assert epochs[1]["oldest"] is None  # nothing lags
    aborted = [line for line in lines if " ABORTED: " in line]
    assert len(aborted) == 1 and aborted[0].startswith(f"[{name}] epoch 1 attempt 1 ABORTED: "), text
    assert "retrying after fencing" in aborted[0] and epochs[1]["extra"] == " | attempts 2"
    assert any(line.startswith(f"[{name}] recovery (epoch 1 attempt 1 failed): fenced ") for line in lines), text
    # One transaction per slot, each with a ledger entry the broker committed.
    ledger = [json.loads(r.value()) for r in read_all(bootstrap, f"eos-ledger-{name}") if r.value()]
    by_epoch = [sum(1 for e in ledger if e["epoch"] == n) for n in (0, 1)]
    assert [int(m["txns"]) for m in epochs] == [int(m["slots"]) for m in epochs] == by_epoch


def test_live_line_on_a_terminal():
    master, replica = os.openpty()
    terminal = os.fdopen(replica, "w")
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: _drain(master, chunks), daemon=True)
    reader.start()
    try:
        tracker = EpochTracker()
        printer = ProgressPrinter("p", terminal, tracker=tracker)  # live: detected from the tty
        tracker.on_epoch_start(3, 1)
        printer.on_epoch_start(3, 1)
        wait_for(lambda: b"[p] epoch 3: read+write+pre-commit" in b"".join(chunks))
        tracker.on_phase(3, 1, COMMIT)
        wait_for(lambda: b"[p] epoch 3: commit" in b"".join(chunks))
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


def test_a_progress_costs_the_listener_two_jvm_calls(spark, bootstrap, new_topic, unique_name, tmp_path, monkeypatch):
    # PySpark's own listener wrapper copies every field of every progress into Python objects, a
    # JVM call per field: ~90 ms of the JVM's CPU per epoch. The bridge reads Spark's JSON of it.
    from py4j.clientserver import ClientServerConnection

    from eos.observe.progress import SparkProgressBridge

    listener_threads: set[int] = set()
    delivered: list[int] = []
    calls: dict[int, int] = {}
    send, deliver = ClientServerConnection.send_command, SparkProgressBridge.deliver

    def counting_send(self, *args, **kwargs):
        calls[threading.get_ident()] = calls.get(threading.get_ident(), 0) + 1
        return send(self, *args, **kwargs)

    def noting_deliver(self, progress):
        if threading.current_thread() is not threading.main_thread():  # the bus, not catch_up
            listener_threads.add(threading.get_ident())
            delivered.append(progress["batchId"])
        return deliver(self, progress)

    monkeypatch.setattr(ClientServerConnection, "send_command", counting_send)
    monkeypatch.setattr(SparkProgressBridge, "deliver", noting_deliver)
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 300)
    name = unique_name("p")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=100)
    result = run_in_process(spark, write_pipeline(tmp_path, config), progress=True)
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    assert result.epochs_committed == 3 and delivered, "the listener bus delivered no progress"
    per_progress = sum(calls.get(t, 0) for t in listener_threads) / len(delivered)
    assert per_progress <= 4, f"{per_progress:.1f} JVM calls per progress on the listener's thread"

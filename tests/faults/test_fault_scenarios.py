"""Faults beyond a crash at a protocol point (issue 4): a broker restart mid-epoch, an outage
longer than the transaction timeout, a zombie attempt, task failures retried by Spark, and a
stateful (windowed) pipeline crashed at every point."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eos.failpoints import PROTOCOL_POINTS
from eos_connectors.kafka.clients import admin_client, end_offsets
from tests.faults.test_fault_matrix import eos_verify, run_until_done
from tests.pipelines import (
    ROOT,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)
from tests.support import start_local_broker


def _exactly_once(bootstrap: str, source: str, sink: str, records: int) -> dict:
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert report["ok"], report
    assert report["output_records"] == report["input_records"] == records, report
    return report


def test_broker_restart_mid_epoch(tmp_path, unique_name):
    """The broker is stopped and started again while slot 0 is in the middle of producing epoch 1
    (paused there) and slot 1 has pre-committed and waits for the decision."""
    kafka = start_local_broker(tmp_path / "own-broker")
    try:
        bootstrap, broker = kafka.bootstrap, kafka.broker  # type: ignore[attr-defined]
        admin = admin_client({"bootstrap.servers": bootstrap})
        from eos_connectors.kafka.clients import create_topic

        source, sink = unique_name("in"), unique_name("out")
        create_topic(admin, source, 2)
        create_topic(admin, sink, 2)
        produce_numbered(bootstrap, source, 0, 900)
        checkpoint = tmp_path / "ck"
        path = write_pipeline(tmp_path, passthrough_pipeline(unique_name("p"), bootstrap, source, sink, checkpoint))
        proc = subprocess.Popen(
            [sys.executable, "-m", "eos", "run", str(path), "--failpoint", "sink.mid_produce=pause(12)@epoch=1,slot=0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        marker_dir = checkpoint / "_eos" / "scratch" / "failpoints"
        deadline = time.monotonic() + 240
        while not (marker_dir.is_dir() and any(marker_dir.iterdir())):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "epoch 1 never started"
            time.sleep(0.2)
        broker.stop()  # a clean broker shutdown in the middle of the epoch
        time.sleep(3)
        broker.start()
        proc.communicate(timeout=400)
        if proc.returncode != 0:  # the epoch may exhaust its retries while the broker is away
            run_until_done(path)
        _exactly_once(bootstrap, source, sink, 900)
    finally:
        kafka.close()


def test_outage_longer_than_the_transaction_timeout_loses_nothing(bootstrap, new_topic, unique_name, tmp_path):
    """Crash after pre-commit with a 10 s transaction timeout, stay down until the broker has
    aborted the pre-committed transactions, restart. Flink documents data loss here; eos replays
    the epoch (the ledger shows it was never committed) and loses nothing."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 900)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    config["sinks"][0]["kafka"]["config"] = {"transaction.timeout.ms": 10_000}
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]

    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = {sink: [0, 1]}

    def still_open() -> bool:  # the abort markers move the high watermark too: compare fresh values
        return end_offsets(admin, partitions, read_committed=True) != end_offsets(admin, partitions, False)

    assert still_open(), "nothing was left open by the crash"
    started = time.monotonic()
    while still_open():  # until the broker aborts them at transaction.timeout.ms
        assert time.monotonic() - started < 90, "the broker never aborted the timed-out transactions"
        time.sleep(0.5)
    assert time.monotonic() - started > 3, "the transactions ended before their timeout: not a timeout abort"

    run_until_done(path)
    report = _exactly_once(bootstrap, source, sink, 900)
    assert report["aborted_records_seen"] > 0


def test_a_zombie_attempt_is_fenced_and_commits_nothing(bootstrap, new_topic, unique_name, tmp_path):
    """Slot 1 of epoch 1's first attempt stalls after the decision, before committing (in the
    worker thread that holds its transaction). The driver waits for its commit report until the
    epoch times out, fences every id and runs attempt 2, which commits. The stalled thread wakes
    up, tries to commit, and is refused.

    The zombie must wake while the run still goes on, whatever the speed of the epochs. It sleeps
    16 s from the decision (t0). The driver fences at t0 + 8 s (the timeout); the 19 epochs after
    epoch 1 (3000 records, 150 per epoch) each wait min_pause = 1 s after the one before, so the
    run ends after t0 + 27 s at the earliest: 11 s to spare, and 8 s for the fencing."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 3000)
    name = unique_name("p")
    config = passthrough_pipeline(
        name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=150, timeout="8s", min_pause="1s"
    )
    path = write_pipeline(tmp_path, config)
    finished = eos_subprocess(
        "run", str(path), "--failpoint", "sink.after_agreement=pause(16)@epoch=1,slot=1,attempt=1", timeout=600
    )
    assert finished.returncode == 0, finished.output[-4000:]
    assert "epoch 1 attempt 1 ABORTED" in finished.output
    assert f"commit of eos/{name}/out/" in finished.output, "the zombie never woke up to try its commit"
    report = _exactly_once(bootstrap, source, sink, 3000)
    assert report["aborted_records_seen"] > 0  # the zombie's records, aborted by the fencing


def test_task_failures_are_retried_by_spark(bootstrap, new_topic, unique_name, tmp_path):
    """A source read task fails once; Spark retries it (local[2,3]) within the same epoch attempt."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 900)
    path = write_pipeline(tmp_path, passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck"))
    finished = eos_subprocess("run", str(path), "--master", "local[2,3]", "--failpoint", "source.read=raise@times=1")
    assert finished.returncode == 0, finished.output[-4000:]
    fired = list((tmp_path / "ck" / "_eos" / "scratch" / "failpoints").glob("source_read_raise*"))
    assert fired, "the read task never failed"
    assert "ABORTED" not in finished.output  # Spark's retry, not an epoch retry
    _exactly_once(bootstrap, source, sink, 900)


# ---------------------------------------------------------------------------------------------
# A stateful pipeline: counts per group per 10-second event-time window
# ---------------------------------------------------------------------------------------------

BASE_MS = 1_767_225_600_000


def _produce_ticks(bootstrap: str, topic: str, count: int) -> None:
    from eos_connectors.kafka.clients import producer

    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    def iso(ms: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"

    # Keyed by id, so both partitions advance through event time together (see docs/EXACTLY_ONCE.md
    # on admission control and watermarks); the last record, a minute later, closes every window
    # before it (a WHERE filter cannot exclude it: Spark pushes such filters below the watermark).
    for i in range(count):
        tick = {"id": f"t{i}", "grp": f"g{i % 3}", "ts": iso(BASE_MS + i * 200)}
        out.produce(topic, json.dumps(tick).encode(), tick["id"].encode())
    closer = {"id": "closer", "grp": "end", "ts": iso(BASE_MS + count * 200 + 60_000)}
    out.produce(topic, json.dumps(closer).encode(), b"closer")
    assert out.flush(30) == 0


def _windowed_pipeline(
    name: str, bootstrap: str, source: str, sink: str, folder: Path, spark_conf: dict[str, str] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config: dict = {
        "name": name,
        "checkpoint": str(folder / "ck"),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s"},
        "sources": [{
            "name": "ticks",
            "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 150},
            "value_format": {"type": "json", "schema": "tick.avsc"},
            "watermark": {"column": "ts", "delay": "20 seconds"},
        }],
        "transforms": [{
            "name": "counts",
            "sql": "SELECT grp, window.start AS window_start, count(*) AS n FROM ticks "
                   "GROUP BY grp, window(ts, '10 seconds')",
        }],
        "sinks": [{"name": "out", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "grp",
                   "value_format": "json"}],
    }  # fmt: skip
    if spark_conf:
        config["spark"] = {"conf": spark_conf}
    return write_pipeline(folder, config)


def _verify_windows(bootstrap: str, source: str, sink: str, folder: Path) -> None:
    spec = folder / "verify.yaml"
    spec.write_text(json.dumps({
        "bootstrap": bootstrap,
        "input": {"topic": source, "format": "json"},
        "output": {"topic": sink, "format": "json"},
        "aggregate": {"group_by": {"grp": "grp", "window_start": {"field": "ts", "window": "10s"}},
                      "values": {"n": "count"}, "watermark_delay": "20s"},
    }))  # fmt: skip
    report = eos_verify("--spec", str(spec))
    assert report["ok"], report
    assert report["expected"] == 36 and report["output_records"] == 36  # 3 groups x 12 windows


@pytest.mark.parametrize("point", PROTOCOL_POINTS)
def test_stateful_pipeline_crashed_at(point, bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    _produce_ticks(bootstrap, source, 600)
    path = _windowed_pipeline(unique_name("w"), bootstrap, source, sink, tmp_path)
    crashed = eos_subprocess("run", str(path), "--failpoint", f"{point}=kill@epoch=2")
    assert crashed.killed, f"the failpoint {point} did not fire:\n{crashed.output[-3000:]}"
    run_until_done(path)
    _verify_windows(bootstrap, source, sink, tmp_path)
    # No `spark.conf` names a store: these crashes were recovered by eos's default, in memory.
    found = _state_files(tmp_path / "ck")
    assert found["memory"] > 0 and found["rocksdb"] == 0, found


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _state_files(checkpoint: Path) -> dict[str, int]:
    """State store files by kind: RocksDB's changelogs and snapshots, the in-memory store's deltas
    and snapshots (their names: VERSION.changelog / .zip, VERSION.delta / .snapshot)."""
    kinds = {"rocksdb": (".changelog", ".zip"), "memory": (".delta", ".snapshot")}
    found = {kind: 0 for kind in kinds}
    for file in (checkpoint / "state").rglob("*"):
        for kind, suffixes in kinds.items():
            found[kind] += file.name.endswith(suffixes)
    return found


def test_a_checkpoint_keeps_its_state_store_when_the_default_changes(bootstrap, new_topic, unique_name, tmp_path):
    """eos's default state store was RocksDB and is now Spark's in-memory one. A stateful pipeline
    started on RocksDB and killed mid-epoch, then restarted without naming a store, must go on
    with RocksDB (Spark pins a checkpoint's store in its offset log): under the other store its
    windows would restart empty, or the restart would fail."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    _produce_ticks(bootstrap, source, 600)
    name = unique_name("w")
    on_rocksdb = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}
    path = _windowed_pipeline(name, bootstrap, source, sink, tmp_path, on_rocksdb)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=2")
    assert crashed.killed, f"the failpoint did not fire:\n{crashed.output[-3000:]}"
    before = _state_files(tmp_path / "ck")
    assert before["rocksdb"] > 0 and before["memory"] == 0, before

    _windowed_pipeline(name, bootstrap, source, sink, tmp_path)  # the same file, no store named
    run_until_done(path)
    _verify_windows(bootstrap, source, sink, tmp_path)
    after = _state_files(tmp_path / "ck")
    assert after["memory"] == 0 and after["rocksdb"] > before["rocksdb"], (before, after)

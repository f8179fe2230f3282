"""The protocol's invariants (docs/EXACTLY_ONCE.md: I1, I2, I4, I5), on a real broker and a real local Spark."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaException

from eos.protocol.checkpoint import Checkpoint
from eos_connectors.kafka.clients import producer
from tests.pipelines import (
    all_values,
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    fence_and_read_ledger,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)
from tests.support import read_all


def _ledger(bootstrap: str, pipeline: str) -> list[dict]:
    return [json.loads(r.value()) for r in read_all(bootstrap, f"eos-ledger-{pipeline}") if r.value() is not None]


def test_i1_no_record_is_visible_before_every_slot_precommitted(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Slot 1 stalls after pre-committing, before voting: slot 0 has pre-committed too and waits
    for the decision. While it waits, read_uncommitted sees the epoch's records and
    read_committed sees none of them."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 400)
    path = write_pipeline(
        tmp_path,
        passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=None),
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_in_process(spark, path, failpoints=["sink.after_precommit=pause(8)@epoch=0,slot=1"])
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 120
    while sum(all_values(bootstrap, sink).values()) < len(sent):
        assert time.monotonic() < deadline, "the slots never pre-committed"
        assert runner.is_alive(), errors
        time.sleep(0.2)
    # Every record of the epoch is in the log, inside open transactions, and invisible.
    assert sum(committed_values(bootstrap, sink).values()) == 0
    runner.join(180)
    assert not errors, errors
    assert_exactly_once(sent, committed_values(bootstrap, sink))


def test_failed_attempt_is_aborted_and_retried(spark, bootstrap, new_topic, unique_name, tmp_path):
    """A task failure mid-produce aborts every slot of the attempt; the retry commits the epoch
    once. The aborted records stay visible to read_uncommitted: the fault really happened (I6)."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 600)
    name = unique_name("p")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    result = run_in_process(spark, path, failpoints=["sink.after_precommit=raise@epoch=1,slot=0"])
    assert result.epochs_committed == 2
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    aborted = all_values(bootstrap, sink) - committed_values(bootstrap, sink)
    assert sum(aborted.values()) > 0, "the failed attempt left no aborted records: did the fault fire?"
    epochs = Counter((e["sink"], e["slot"], e["epoch"]) for e in _ledger(bootstrap, name))
    assert all(n == 1 for n in epochs.values()), epochs
    assert {e["attempt"] for e in _ledger(bootstrap, name) if e["epoch"] == 1} == {2}


def test_i2_and_i4_replay_after_kill_between_slot_commits(bootstrap, new_topic, unique_name, tmp_path):
    """kill -9 after slot 0 committed epoch 1 and before slot 1 did. On restart Spark replays
    epoch 1 with the offsets it logged before the crash (I4), even though more input arrived;
    slot 0 is skipped via the ledger and slot 1 commits: each (sink, slot, epoch) commits
    exactly once (I2), and the output is exactly the input."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    name = unique_name("p")
    checkpoint = tmp_path / "ck"
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint))

    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]
    logged = (checkpoint / "offsets" / "1").read_bytes()
    planned = Checkpoint(str(checkpoint)).logged_offsets(1)[0]
    previous = Checkpoint(str(checkpoint)).logged_offsets(0)[0]
    # Slot 1's pre-committed transaction is still open and, on the one-partition ledger topic,
    # may hold the last stable offset below slot 0's committed ledger record. Fence first, as
    # recovery does, then read.
    ledger_before = {(slot, e.epoch) for (_, slot), e in fence_and_read_ledger(path).items()}
    assert (0, 1) in ledger_before and (1, 1) not in ledger_before, ledger_before

    sent += produce_numbered(bootstrap, source, 900, 300)  # arrives while the pipeline is down
    resumed = eos_subprocess("run", str(path))
    assert resumed.returncode == 0, resumed.output[-3000:]

    assert (checkpoint / "offsets" / "1").read_bytes() == logged  # I4: the barrier never moved
    planned_records = sum(planned[t][p] - previous[t][p] for t in planned for p in planned[t])
    entries = _ledger(bootstrap, name)
    assert sum(e["records"] for e in entries if e["epoch"] == 1) == planned_records
    commits = Counter((e["sink"], e["slot"], e["epoch"]) for e in entries)
    assert all(n == 1 for n in commits.values()), commits  # I2
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    assert sum((all_values(bootstrap, sink) - committed_values(bootstrap, sink)).values()) > 0  # I6


def test_i5_a_fenced_zombie_cannot_commit(bootstrap, new_topic, unique_name):
    """The old instance of a transactional id, fenced by a newer one mid-transaction, fails to
    commit and its records never become visible."""
    topic = new_topic()
    txid = unique_name("slot")
    zombie = producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"from-the-zombie")
    zombie.flush(30)

    successor = producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
    successor.init_transactions(30)  # fences the zombie and aborts its open transaction
    successor.begin_transaction()
    successor.produce(topic, b"from-the-successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as failure:
        zombie.commit_transaction(30)
    assert failure.value.args[0].fatal() or failure.value.args[0].txn_requires_abort()
    assert [r.value() for r in read_all(bootstrap, topic)] == [b"from-the-successor"]
    assert b"from-the-zombie" in [r.value() for r in read_all(bootstrap, topic, "read_uncommitted")]


def test_chained_pipelines_stay_exactly_once(bootstrap, new_topic, unique_name, tmp_path):
    """Pipeline B reads pipeline A's output with read_committed while A crashes and recovers:
    B never sees A's aborted attempts, and the end of the chain is exactly the input."""
    raw, middle, final = new_topic(partitions=2), new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, raw, 0, 800)
    first = write_pipeline(
        tmp_path / "a",
        passthrough_pipeline(
            unique_name("a"),
            bootstrap,
            raw,
            middle,
            tmp_path / "a" / "ck",
            sql="SELECT key, concat(value, '-a') AS value FROM events",
        ),
    )
    second = write_pipeline(
        tmp_path / "b",
        passthrough_pipeline(
            unique_name("b"),
            bootstrap,
            middle,
            final,
            tmp_path / "b" / "ck",
            sql="SELECT key, concat(value, '-b') AS value FROM events",
        ),
    )
    crashed = eos_subprocess("run", str(first), "--failpoint", "sink.after_precommit=kill@epoch=1,slot=1")
    assert crashed.killed, crashed.output[-3000:]
    assert eos_subprocess("run", str(second)).returncode == 0  # reads what A committed so far
    assert eos_subprocess("run", str(first)).returncode == 0
    assert eos_subprocess("run", str(second)).returncode == 0
    assert sum((all_values(bootstrap, middle) - committed_values(bootstrap, middle)).values()) > 0
    assert_exactly_once([f"{v}-a-b" for v in sent], committed_values(bootstrap, final))


def test_at_least_once_mode_writes_without_transactions(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=2), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 500)
    name = unique_name("p")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", mode="at-least-once")
    run_in_process(spark, write_pipeline(tmp_path, config))
    assert_exactly_once(sent, committed_values(bootstrap, sink))  # no fault: nothing lost or doubled
    assert f"eos-ledger-{name}" not in read_topics(bootstrap)


def read_topics(bootstrap: str) -> set[str]:
    from eos_connectors.kafka.clients import admin_client

    return set(admin_client({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)

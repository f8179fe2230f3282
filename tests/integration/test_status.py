"""`eos status` on a stopped pipeline, against a real broker: checkpoint and ledger agree with
what the run committed, lag follows new input, and a lingering transaction is found (and
fenced only when asked)."""

from __future__ import annotations

import json
import os

import pytest

from eos.config import load_pipeline
from eos.protocol.checkpoint import Checkpoint
from eos_connectors.kafka.clients import admin_client, describe_partitions, end_offsets, producer
from eos_connectors.kafka.ledger import read_ledger
from eos_ops.status import gather, render, tools_classpath
from tests.pipelines import eos_subprocess, passthrough_pipeline, produce_numbered, run_in_process, write_pipeline


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    admin = admin_client({"bootstrap.servers": bootstrap})
    ends = end_offsets(admin, describe_partitions(admin, [topic]), read_committed=False)
    return {p: o for (_, p), o in ends.items()}


@pytest.fixture
def stopped_pipeline(spark, bootstrap, new_topic, unique_name, tmp_path):
    """A pipeline that ran to the end of its input and stopped."""
    source, sink = new_topic(partitions=3), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 1000)
    name = unique_name("s")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    result = run_in_process(spark, path)
    return path, name, source, sink, result


def test_status_of_a_stopped_pipeline_matches_its_checkpoint_ledger_and_lag(stopped_pipeline, bootstrap):
    path, name, source, _, result = stopped_pipeline
    config = load_pipeline(path)
    report = gather(config, path.parent, transactions=False)

    point = report["checkpoint"]
    assert point["running"] is None and point["exists"]
    assert point["last_committed_epoch"] == point["last_logged_epoch"] == result.epochs_committed - 1
    assert point["pending_replay"] is None
    # The unfenced read sees exactly what recovery's fenced read sees (nothing is open now).
    ledger = read_ledger({"bootstrap.servers": bootstrap}, f"eos-ledger-{name}", name)
    shown = {(e["sink"], e["slot"]): e["epoch"] for e in report["ledger"]["entries"]}
    assert shown == {key: entry.epoch for key, entry in ledger.items()}
    assert set(shown) == {("out", 0), ("out", 1)}
    assert max(shown.values()) == point["last_committed_epoch"]
    assert all(e["this_checkpoint"] for e in report["ledger"]["entries"])
    assert report["ledger"]["open"] == [] and report["sink_topics"][0]["open"] == []
    assert sum(r["lag"] for r in report["lag"]) == 0

    # New input: the lag per partition is exactly what each partition grew by.
    before = high_watermarks(bootstrap, source)
    produce_numbered(bootstrap, source, 1000, 250)
    grown = {p: o - before[p] for p, o in high_watermarks(bootstrap, source).items()}
    lag = gather(config, path.parent, transactions=False)["lag"]
    assert {r["partition"]: r["lag"] for r in lag} == grown
    assert sum(r["lag"] for r in lag) == 250
    assert all(r["committed"] == before[r["partition"]] for r in lag)

    # The command line, as JSON and as text.
    as_json = eos_subprocess("status", str(path), "--json", "--no-txns", timeout=120)
    assert as_json.returncode == 0, as_json.output[-2000:]
    data = json.loads(as_json.output[as_json.output.index("{") :])
    assert data["checkpoint"]["last_committed_epoch"] == point["last_committed_epoch"]
    assert sum(r["lag"] for r in data["lag"]) == 250
    text = "\n".join(render(data))
    assert f"last committed epoch {point['last_committed_epoch']}" in text
    assert "source lag: 250 offsets behind" in text

    # While a process holds the checkpoint (as a running pipeline does), status says so.
    checkpoint = Checkpoint(config.checkpoint_path(path.parent))
    checkpoint.lock()
    try:
        assert gather(config, path.parent, transactions=False)["checkpoint"]["running"] == f"pid {os.getpid()}"
    finally:
        checkpoint.unlock()
    assert gather(config, path.parent, transactions=False)["checkpoint"]["running"] is None


def test_status_finds_a_lingering_transaction_and_fences_only_when_asked(stopped_pipeline, bootstrap):
    if tools_classpath() is None:
        pytest.skip("Kafka's TransactionsCommand jars are not cached here (`eos kafka fetch`); listing needs them")
    path, name, _, sink, _ = stopped_pipeline
    config = load_pipeline(path)
    # A zombie of slot 1: a transaction on the pipeline's own id, left open on the sink and the
    # ledger topic (as a slot whose driver died after pre-commit leaves it).
    zombie = producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-out-1"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(sink, b"never committed", b"k")
    zombie.produce(f"eos-ledger-{name}", b'{"epoch": 99}', f"{name}/out/1".encode())
    assert zombie.flush(30) == 0

    report = gather(config, path.parent)
    txns = report["transactions"]
    assert txns["available"], txns
    assert [t["transactional_id"] for t in txns["open"]] == [f"{name}-out-1"]
    assert txns["open"][0]["state"] == "Ongoing" and txns["open"][0]["lingering"]  # nothing runs the pipeline
    assert report["sink_topics"][0]["open"], "the open transaction pins the sink topic's LSO"
    assert report["ledger"]["open"], "and the ledger topic's"
    assert all(e["epoch"] < 99 for e in report["ledger"]["entries"])  # uncommitted: invisible
    text = "\n".join(render(report))
    assert "LINGERING" in text and "OPEN TRANSACTION" in text

    # Status alone never fences: the transaction is still open afterwards.
    assert gather(config, path.parent)["transactions"]["open"]
    fenced = gather(config, path.parent, fence_first=True)
    assert fenced["ledger"]["fenced"] and fenced["ledger"]["open"] == []
    assert fenced["transactions"]["open"] == [] and fenced["sink_topics"][0]["open"] == []
    with pytest.raises(Exception, match=r"(?i)fenc|epoch"):
        zombie.commit_transaction(10)

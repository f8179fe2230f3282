"""`eos status` against a real broker and real runs: while the pipeline runs (read-only, and
--fence refused), once it stopped (checkpoint, control log, ledger and lag agree with what the run
committed; the same through a JVM gateway; the command line), and after a kill -9 left a
transaction open (found, then fenced only when asked)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any

import pytest

from eos.config import load_pipeline
from eos.errors import EosError
from eos.protocol.report import EpochListener
from eos_connectors.kafka.clients import admin_client, describe_partitions, end_offsets
from eos_connectors.kafka.ledger import read_ledger
from eos_ops.status import gather, render, tools_classpath
from tests.pipelines import eos_subprocess, passthrough_pipeline, produce_numbered, run_in_process, write_pipeline
from tests.support import read_all


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    admin = admin_client({"bootstrap.servers": bootstrap})
    ends = end_offsets(admin, describe_partitions(admin, [topic]), read_committed=False)
    return {p: o for (_, p), o in ends.items()}


def json_of(output: str) -> dict[str, Any]:
    """The JSON report in a command's output (other lines may come before and after it)."""
    start = 0 if output.startswith("{") else output.index("\n{") + 1
    return json.JSONDecoder().raw_decode(output[start:])[0]


class StatusDuringRun(EpochListener):
    """Runs `eos status` (in process) once, while the pipeline runs: after its first epoch."""

    def __init__(self, path):
        self.path = path
        self.report: dict[str, Any] | None = None
        self.fence_refused: str | None = None
        self.error: str | None = None

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        if self.report is not None or self.error is not None:
            return
        try:
            config = load_pipeline(self.path)
            self.report = gather(config, self.path.parent, transactions=False)
            try:
                gather(config, self.path.parent, fence_first=True, transactions=False)
            except EosError as exc:
                self.fence_refused = exc.message
        except Exception as exc:
            self.error = repr(exc)


def test_status_while_running_and_stopped_matches_checkpoint_control_log_ledger_and_lag(
    spark, bootstrap, new_topic, unique_name, tmp_path
):
    source, sink = new_topic(partitions=3), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 1000)
    name = unique_name("s")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    during = StatusDuringRun(path)
    result = run_in_process(spark, path, listeners=[during])
    assert result.epochs_committed == 2
    config = load_pipeline(path)

    # While it ran: its driver answered, status read without fencing, and --fence was refused.
    assert during.error is None and during.report is not None, during.error
    running = during.report
    assert running["running"] and running["control"]["driver"]["answers"]
    assert "ping_key" not in running["control"]["driver"]  # the driver's proof of life is a secret
    assert running["control"]["driver"]["pid"] == os.getpid()
    assert running["checkpoint"]["last_committed_epoch"] >= 0
    assert during.fence_refused and "driver answers" in during.fence_refused

    report = gather(config, path.parent)
    point = report["checkpoint"]
    assert not report["running"] and point["exists"] and point["parallelism"] == 2
    assert point["last_committed_epoch"] == point["last_logged_epoch"] == result.epochs_committed - 1
    assert point["pending_replay"] is None and point["read_through"] == "local files"
    # The control log: the driver that ran it (no longer answering), its last decision, pools.
    control = report["control"]
    assert control["driver"]["pid"] == os.getpid() and not control["driver"]["answers"]
    assert control["decision"]["epoch"] == point["last_committed_epoch"]
    # The unfenced read sees exactly what recovery's fenced read sees (nothing is open now).
    ledger = read_ledger({"bootstrap.servers": bootstrap}, f"eos-ledger-{name}", name)
    [section] = report["ledger"]
    shown = {(e["sink"], e["slot"]): e["epoch"] for e in section["entries"]}
    assert shown == {key: entry.epoch for key, entry in ledger.items()} and shown
    assert all(e["this_checkpoint"] for e in section["entries"]) and section["open"] == []
    # The decision's transactions are the last epoch's ledger entries.
    last = [e for e in section["entries"] if e["epoch"] == point["last_committed_epoch"]]
    assert control["decision"]["transactions"] == {"out": len(last)}
    pools = control["pools"]
    assert set(pools) == {"out"} and pools["out"]["kind"] == "kafka" and pools["out"]["size"] >= len(last)
    assert report["lingering"] == [{"sink": "out", "kind": "kafka", "open": []}]
    txns = report["transactions"]
    if tools_classpath() is not None:
        assert txns["available"] and txns["open"] == [], txns
        assert txns["ids"] == pools["out"]["size"] + 1  # the pool's ids and the driver's own
    else:
        assert not txns["available"] and "not cached" in txns["reason"]
    assert sum(r["lag"] for r in report["lag"]["rows"]) == 0 and report["lag"]["error"] is None

    # New input: the lag per partition is exactly what each partition grew by.
    before = high_watermarks(bootstrap, source)
    producing = time.time()
    produce_numbered(bootstrap, source, 1000, 250)
    grown = {p: o - before[p] for p, o in high_watermarks(bootstrap, source).items()}
    lag = gather(config, path.parent, transactions=False)["lag"]["rows"]
    assert {r["partition"]: r["lag"] for r in lag} == grown
    assert sum(r["lag"] for r in lag) == 250
    assert all(r["committed"] == before[r["partition"]] for r in lag)
    # ...and in time: each lagging partition's oldest waiting record is one produced just now.
    for row in lag:
        if row["lag"]:
            assert producing - 1 <= row["oldest"] <= time.time(), row
            assert 0 <= row["waited_s"] <= time.time() - producing + 1, row

    # Through a JVM gateway (as for an hdfs:// or s3a:// checkpoint): the same checkpoint.
    through_jvm = gather(config, path.parent, transactions=False, jvm=True)["checkpoint"]
    assert through_jvm["read_through"].startswith("a JVM gateway")
    assert through_jvm["location"].startswith("file:")
    ignore = ("location", "read_through", "last_committed_at")
    assert {k: v for k, v in through_jvm.items() if k not in ignore} == {
        k: v for k, v in point.items() if k not in ignore
    }
    assert abs(through_jvm["last_committed_at"] - point["last_committed_at"]) < 2

    # The command line, as JSON and as text.
    as_json = eos_subprocess("status", str(path), "--json", "--no-txns", timeout=180)
    assert as_json.returncode == 0, as_json.output[-2000:]
    data = json_of(as_json.output)
    assert data["checkpoint"]["last_committed_epoch"] == point["last_committed_epoch"]
    assert sum(r["lag"] for r in data["lag"]["rows"]) == 250
    text = "\n".join(render(data))
    assert f"last committed epoch {point['last_committed_epoch']}" in text
    assert "source lag: 250 offsets behind" in text and "does not answer: not running" in text
    assert "; the oldest record not yet committed has waited " in text
    assert f"last decision: epoch {point['last_committed_epoch']} attempt 1 commits {len(last)} of out" in text


def test_status_finds_a_lingering_transaction_after_kill_and_fences_only_when_asked(
    bootstrap, new_topic, unique_name, tmp_path
):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 800)
    name = unique_name("k")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    # kill -9 of the driver (and its Spark, and its Python workers) once slot 0 of epoch 1 has
    # pre-committed: its transaction stays open on the sink and the ledger topic.
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=1,slot=0")
    assert crashed.killed, crashed.output[-3000:]
    config = load_pipeline(path)
    report = gather(config, path.parent)
    assert not report["running"] and not report["control"]["driver"]["answers"]
    assert report["control"]["driver"]["pid"] != os.getpid()
    assert report["checkpoint"]["pending_replay"] == 1
    assert report["control"]["decision"]["epoch"] == 0  # epoch 1 never got a decision
    # The open transaction pins the sink topic and the ledger topic: the sink reports both.
    [lingering] = report["lingering"]
    pinned = {item.split("/")[0] for item in lingering["open"]}
    assert pinned == {sink, f"eos-ledger-{name}"}, lingering
    [section] = report["ledger"]
    assert section["open"], "the open transaction hides the ledger entries behind it"
    assert all(e["epoch"] == 0 for e in section["entries"])  # uncommitted: invisible
    text = "\n".join(render(report))
    assert "LINGERING" in text and "OPEN TRANSACTION" in text and "hides newer entries" in text
    if tools_classpath() is not None:
        txns = report["transactions"]
        assert txns["available"], txns
        opened = [t for t in txns["open"] if t["transactional_id"].startswith(f"eos/{name}/out/")]
        assert opened and all(t["state"] == "Ongoing" and t["lingering"] for t in opened), txns
        assert sink in opened[0]["partitions"]

    # Status alone never fences: the transaction is still open afterwards.
    assert gather(config, path.parent, transactions=False)["lingering"][0]["open"]
    fenced = eos_subprocess("status", str(path), "--fence", "--json", timeout=300)
    assert fenced.returncode == 0, fenced.output[-3000:]
    assert "FENCING every transactional id" in fenced.output
    data = json_of(fenced.output)
    assert data["fence"]["error"] is None and data["fence"]["fenced_ids"] == data["control"]["pools"]["out"]["size"]
    assert data["lingering"] == [{"sink": "out", "kind": "kafka", "open": []}] and data["ledger"][0]["open"] == []
    after = gather(config, path.parent)
    assert after["lingering"][0]["open"] == [] and after["ledger"][0]["open"] == []
    if tools_classpath() is not None:
        assert after["transactions"]["open"] == [], after["transactions"]
    # Fencing aborted it: what read_committed readers see is only epoch 0's output.
    assert Counter(r.value() for r in read_all(bootstrap, sink)).total() == 500


def test_fence_is_refused_for_a_pipeline_without_control_log(bootstrap, new_topic, unique_name, tmp_path):
    """A pipeline that never ran has no control log: status says so, and --fence has nothing to
    fence with (it does not guess ids)."""
    source, sink = new_topic(), new_topic()
    name = unique_name("n")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    config = load_pipeline(path)
    report = gather(config, path.parent, transactions=False)
    assert not report["checkpoint"]["exists"] and not report["control"]["exists"]
    assert report["control"]["driver"] is None and report["ledger"][0]["exists"] is False
    text = "\n".join(render(report))
    assert "never started here" in text and "does not exist yet" in text
    with pytest.raises(EosError):
        gather(config, path.parent, fence_first=True, transactions=False)

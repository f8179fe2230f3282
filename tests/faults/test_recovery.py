"""Recovery after kill -9 of the driver (subprocess `eos run`), on a real broker and real Spark."""

from __future__ import annotations

from tests.pipelines import (
    all_values,
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)
from tests.support import read_all


def test_kill_after_commit_before_spark_commit_log_replays_without_duplicates(
    bootstrap, new_topic, unique_name, tmp_path
):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    name = unique_name("p")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))

    crashed = eos_subprocess("run", str(path), "--failpoint", "epoch.after_commit=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]
    assert "kill -9 at epoch.after_commit" in crashed.output
    # Epoch 1 is fully committed in Kafka but Spark never wrote its commit log.
    assert (tmp_path / "ck" / "offsets" / "1").exists() and not (tmp_path / "ck" / "commits" / "1").exists()
    committed_before_restart = committed_values(bootstrap, sink)

    resumed = eos_subprocess("run", str(path))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "epoch 1 was logged but not marked committed" in resumed.output
    assert "replay: 2 slot(s) already committed, skipped" in resumed.output

    final = committed_values(bootstrap, sink)
    assert_exactly_once(sent, final)
    # 900 records at <= 500 an epoch: epochs 0 and 1 were both committed before the kill.
    assert_exactly_once(sent, committed_before_restart)
    # Nothing was aborted: the replay wrote nothing for epoch 1 at all.
    assert all_values(bootstrap, sink) == final
    ledger = [r for r in read_all(bootstrap, f"eos-ledger-{name}") if r.value() is not None]
    assert len(ledger) == len({(r.key(), r.value()) for r in ledger})

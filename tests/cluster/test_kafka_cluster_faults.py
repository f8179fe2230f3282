"""Exactly once on a real 3-broker KRaft cluster (replication 3, min ISR 2, the transaction state log
at RF 3 / min ISR 2), the way Kafka's own transactions system test runs its copier: brokers bounced
hard and clean under a running pipeline, and the pipeline's own process killed while a broker is
down. Every run is checked by `eos verify` and by a read_committed reader that shares no code with
eos: 0 lost, 0 duplicated, no aborted record visible."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eos_connectors.kafka import ids
from tests.faults.test_fault_matrix import eos_verify, run_until_done
from tests.pipelines import eos_subprocess, passthrough_pipeline, produce_numbered, run_in_process, write_pipeline
from tests.support import Later, independent_committed_values, wait_for, wait_for_topic

pytestmark = pytest.mark.slow


def _fired(checkpoint: Path, prefix: str) -> bool:
    folder = checkpoint / "_eos" / "scratch" / "failpoints"
    return folder.is_dir() and any(p.name.startswith(prefix) for p in folder.iterdir())


def _check(bootstrap: str, source: str, sink: str, sent: list[str]) -> None:
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert report["ok"] and report["lost"] == report["duplicated"] == report["unexpected"] == 0, report
    seen = independent_committed_values(bootstrap, sink, timeout_s=120)
    assert sorted(seen) == sorted(sent), "the independent reader disagrees"


def test_brokers_bounced_under_a_running_pipeline(cluster, bootstrap, new_topic, unique_name, spark, tmp_path):
    """One run, three faults, each while an epoch is between pre-commit and commit (held there by a
    short pause so the fault lands inside the epoch):
      - epoch 2: kill -9 of the broker leading the transaction coordinator of the sink's ids,
        restarted 10 s later;
      - epoch 4: SIGSTOP of the broker leading the output's partition 0 for longer than the
        request timeout (a pause, not a crash), then SIGCONT;
      - epoch 6: kill -9 of the active controller (a controller failover), restarted 10 s later."""
    source, sink = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 2400)
    name = unique_name("p")
    checkpoint = tmp_path / "ck"
    config = passthrough_pipeline(
        name, bootstrap, source, sink, checkpoint, max_records_per_epoch=300, timeout="60s", tolerable_failures=8
    )
    path = write_pipeline(tmp_path, config)
    points = [
        "sink.after_precommit=pause(3)@epoch=2,slot=0,attempt=1",
        "sink.mid_produce=pause(3)@epoch=4,slot=0,attempt=1",
        "sink.after_precommit=pause(3)@epoch=6,slot=1,attempt=1",
    ]
    done: list[object] = []
    runner = threading.Thread(target=lambda: done.append(_run(spark, path, points)), daemon=True)
    runner.start()
    faults: list[str] = []

    wait_for(
        lambda: _fired(checkpoint, "sink_after_precommit_pause_3_epoch_2") or not runner.is_alive(), 300, "epoch 2"
    )
    victim = cluster.transaction_coordinator(ids.pool_id(ids.default_prefix(name), "out", 0))
    cluster.kill(victim)
    faults.append(f"killed transaction coordinator {victim}")
    restarted = Later(10, lambda: cluster.start_node(victim))

    wait_for(lambda: _fired(checkpoint, "sink_mid_produce_pause_3_epoch_4") or not runner.is_alive(), 300, "epoch 4")
    paused = cluster.leader(sink, 0)
    cluster.pause(paused)
    faults.append(f"paused broker {paused}")
    time.sleep(35)  # librdkafka's default request timeout is 30 s
    cluster.resume(paused)

    wait_for(
        lambda: _fired(checkpoint, "sink_after_precommit_pause_3_epoch_6") or not runner.is_alive(), 300, "epoch 6"
    )
    # The first restart waits until the cluster has healed (after the pause too): the controller
    # may be that same node, and killing it inside that wait would be two faults at once.
    restarted.join()
    controller = cluster.active_controller()
    cluster.kill(controller)
    faults.append(f"killed controller {controller}")
    restarted = Later(10, lambda: cluster.start_node(controller))

    runner.join(600)
    restarted.join()
    assert not runner.is_alive(), "the pipeline never finished"
    assert done and not isinstance(done[0], BaseException), done
    assert len(faults) == 3, faults
    cluster.wait_until_healthy(timeout=180)
    _check(bootstrap, source, sink, sent)


def _run(spark, path: Path, failpoints: list[str]) -> object:
    try:
        return run_in_process(spark, path, failpoints=failpoints)
    except BaseException as exc:  # handed to the test thread
        return exc


def test_the_driver_killed_while_a_broker_is_down(cluster, bootstrap, new_topic, unique_name, tmp_path):
    """A broker is stopped cleanly; the pipeline is killed (-9) between two slots' commits; it is
    restarted and finishes while the broker is still down (min ISR 2 of 3 still holds); then the
    broker comes back."""
    source, sink = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 900)
    down = 3
    cluster.stop_node(down)
    path = write_pipeline(
        tmp_path,
        passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=300),
    )
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]
    run_until_done(path)
    cluster.start_node(down)
    _check(bootstrap, source, sink, sent)


def test_the_ledger_is_replicated_like_the_data_it_protects(cluster, bootstrap, admin, unique_name, capsys):
    """Created with replication 3 and min.insync.replicas 2 on three brokers; an existing ledger
    topic with retention is refused (a deleted entry means a replay writes that epoch again); one
    with a single replica is reported."""
    from eos.errors import ConfigError
    from eos_connectors.kafka.clients import create_topic, describe_topics, topic_settings
    from eos_connectors.kafka.ledger import ensure_ledger_topic

    client = {"bootstrap.servers": bootstrap}
    ledger = unique_name("eos-ledger")
    ensure_ledger_topic(client, ledger)
    # The controller has committed the topic; the broker this admin asks may learn of it a moment
    # later (once, in a clean-clone run, describe_topics right away found no such topic).
    wait_for_topic(admin, ledger, 1)
    assert describe_topics(admin, [ledger])[ledger].replication == 3
    settings = topic_settings(admin, ledger)
    assert settings["min.insync.replicas"] == "2" and settings["cleanup.policy"] == "compact"

    retained = unique_name("eos-ledger")
    create_topic(admin, retained, 1, 3, config={"cleanup.policy": "delete"})
    wait_for_topic(admin, retained, 1)
    with pytest.raises(ConfigError, match=r"cleanup\.policy=delete"):
        ensure_ledger_topic(client, retained)

    thin = unique_name("eos-ledger")
    create_topic(admin, thin, 1, 1, config={"cleanup.policy": "compact"})
    wait_for_topic(admin, thin, 1)
    ensure_ledger_topic(client, thin)
    assert f"the ledger topic {thin} has replication factor 1 on a cluster of 3 brokers" in capsys.readouterr().err

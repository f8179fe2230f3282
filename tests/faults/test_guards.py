"""The assumptions the exactly-once proof rests on, checked at run time (issue 10): one driver, a
checkpoint that matches the output, a config that does not change under a pending epoch, a
source topic that is still the same topic, poison decided by the record alone, recovery that
never waits on the pipeline's own transactions. Each test breaks one assumption the way users do
and proves that eos either stays exactly once or refuses with a clear error."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from eos.failpoints import release
from eos_connectors.kafka.clients import create_topic
from tests.faults.test_fault_matrix import eos_verify, run_until_done
from tests.pipelines import (
    ROOT,
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)
from tests.support import read_all


def _wait_for(what: str, condition, proc: subprocess.Popen | None = None, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"{what}: the process ended first:\n{proc.stdout.read()[-3000:] if proc.stdout else ''}"
            )
        assert time.monotonic() < deadline, f"{what}: timed out"
        time.sleep(0.2)


def _popen_run(path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# 1. Two live drivers on one checkpoint
# ---------------------------------------------------------------------------------------------


def test_a_second_driver_is_refused_and_a_takeover_fences_the_first(bootstrap, new_topic, unique_name, tmp_path):
    """Driver B commits epoch 0, logs epoch 1 and stalls with its skip set read. A second driver
    is refused while B answers, and a start with --take-over whose pipeline fails to build fences
    nobody (the take-over overlaps the build only when it cannot fence a live driver). Driver A
    then takes over (--take-over): it fences B, replays epoch 1 and finishes. B wakes up with a
    stale view, tries epoch 1 again, and cannot commit it: it stops with a clear error and nothing
    it wrote becomes visible."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    checkpoint = tmp_path / "ck"
    name = unique_name("p")
    path = write_pipeline(
        tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=300)
    )
    stalled = _popen_run(path, "--failpoint", "epoch.after_offsets_logged=pause(900)@epoch=1")
    try:
        _wait_for("driver B reaches epoch 1", lambda: (checkpoint / "commits" / "0").exists(), stalled)
        time.sleep(2)  # B is now inside epoch 1's pause

        sql = "SELECT no_such_column FROM events"
        broken = passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=300, sql=sql)
        failed = eos_subprocess("run", str(write_pipeline(tmp_path / "broken", broken)), "--take-over")
        assert failed.returncode != 0
        assert "no_such_column" in failed.output, failed.output[-3000:]
        assert stalled.poll() is None  # B still runs, and (below) is still the driver that answers

        refused = eos_subprocess("run", str(path))
        assert refused.returncode != 0
        assert "another eos driver is running this pipeline" in refused.output, refused.output[-3000:]
        assert "--take-over" in refused.output

        took_over = eos_subprocess("run", str(path), "--take-over")
        assert took_over.returncode == 0, took_over.output[-3000:]
        assert_exactly_once(sent, committed_values(bootstrap, sink))
        assert stalled.poll() is None, "driver B was meant to stall until now"

        release(checkpoint / "_eos" / "scratch" / "failpoints")  # B wakes up with its stale view
        output, _ = stalled.communicate(timeout=300)
        assert stalled.returncode != 0, output[-3000:]
        assert "another eos driver took over pipeline" in output, output[-3000:]
        # B did try epoch 1. What its slots got to write depends on whether Spark kept B's Python
        # workers (idle ones end after a minute): kept ones hold producers whose ids A's take-over
        # fenced, so the broker refuses their writes; new ones initialise the ids again (A has
        # stopped) and write, and B cannot record a decision, so the writes are aborted.
        assert "epoch 1 attempt 1 ABORTED" in output, output[-3000:]
    finally:
        if stalled.poll() is None:
            stalled.kill()
    assert_exactly_once(sent, committed_values(bootstrap, sink))  # B's late epoch 1 never committed
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert report["ok"], report  # and nothing B wrote is visible to read_committed readers


# ---------------------------------------------------------------------------------------------
# 2. The ledger is bound to the epoch's offsets
# ---------------------------------------------------------------------------------------------


def test_a_lost_offset_log_file_is_refused_not_replanned(bootstrap, new_topic, unique_name, tmp_path):
    """Epoch 1 is half committed (kill between the slots' commits); then its offset log file is
    lost and the admission cap changed, so Spark would plan a different epoch 1. The ledger says
    slot 0 committed epoch 1 for other offsets: eos refuses instead of skipping a different range."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 900)
    checkpoint = tmp_path / "ck"
    name = unique_name("p")
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint))
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]
    (checkpoint / "offsets" / "1").unlink()
    write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=150))
    refused = eos_subprocess("run", str(path))
    assert refused.returncode != 0
    assert "older than the output it produced" in refused.output, refused.output[-3000:]
    assert "epochs [1]" in refused.output


def test_an_older_copy_of_the_checkpoint_is_refused(bootstrap, new_topic, unique_name, tmp_path):
    """A checkpoint restored from a backup taken two epochs ago: replaying from it would write
    those epochs again. Refused, with the way out."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 500)
    checkpoint = tmp_path / "ck"
    name = unique_name("p")
    path = write_pipeline(
        tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=250)
    )
    assert eos_subprocess("run", str(path)).returncode == 0
    shutil.copytree(checkpoint, tmp_path / "backup")
    sent += produce_numbered(bootstrap, source, 500, 500)
    assert eos_subprocess("run", str(path)).returncode == 0
    shutil.rmtree(checkpoint)
    shutil.copytree(tmp_path / "backup", checkpoint)
    sent += produce_numbered(bootstrap, source, 1000, 100)
    refused = eos_subprocess("run", str(path))
    assert refused.returncode != 0
    assert "the checkpoint is older than the output it produced" in refused.output, refused.output[-3000:]
    assert "eos reset" in refused.output
    assert_exactly_once(sent[:1000], committed_values(bootstrap, sink))  # nothing written twice


# ---------------------------------------------------------------------------------------------
# 3. The config of a pending epoch
# ---------------------------------------------------------------------------------------------


def _changed(config: dict, change: str) -> dict:
    if change == "rename":
        config["sinks"][0]["name"] = "renamed"
    else:  # a different key expression: records would go to other partitions
        config["sinks"][0]["key"] = "concat(key, '-x')"
    return config


def test_a_changed_sink_is_refused_while_its_epoch_is_partly_committed(bootstrap, new_topic, unique_name, tmp_path):
    """kill between the slots' commits of epoch 1, then rename the sink / change its key: refused
    with the way out; `--finish-pending` with the old file completes epoch 1, and then the new file
    runs. Every record exactly once."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    name = unique_name("p")
    for change in ("rename", "key"):
        folder = tmp_path / change

        def old() -> dict:
            return passthrough_pipeline(name + change[0], bootstrap, source, sink, folder / "ck")  # noqa: B023

        path = write_pipeline(folder, old())
        crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1")
        assert crashed.killed, crashed.output[-3000:]
        write_pipeline(
            folder, _changed(passthrough_pipeline(name + change[0], bootstrap, source, sink, folder / "ck"), change)
        )
        refused = eos_subprocess("run", str(path))
        assert refused.returncode != 0, refused.output[-3000:]
        assert "epoch 1 is pending and was already partly committed" in refused.output, refused.output[-3000:]
        assert "--finish-pending" in refused.output
        write_pipeline(folder, old())
        finished = eos_subprocess("run", str(path), "--finish-pending")
        assert finished.returncode == 0, finished.output[-3000:]
        write_pipeline(
            folder, _changed(passthrough_pipeline(name + change[0], bootstrap, source, sink, folder / "ck"), change)
        )
        assert eos_subprocess("run", str(path)).returncode == 0
    # Two pipelines copied the same input once each.
    values = committed_values(bootstrap, sink)
    assert values == {v: 2 for v in sent}, {v: n for v, n in values.items() if n != 2}


def test_a_rename_is_allowed_while_nothing_of_the_epoch_committed(bootstrap, new_topic, unique_name, tmp_path):
    """kill after pre-commit (no decision recorded): the old sink's transactions are open and pin
    its topic's last stable offset. Renaming is allowed (nothing of epoch 1 is committed), and the
    old name's transactional ids are fenced at start-up: recovery does not wait on them."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    name = unique_name("p")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck")
    config["sinks"][0]["kafka"]["config"] = {"transaction.timeout.ms": 600_000}  # waiting it out would show
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=1")
    assert crashed.killed, crashed.output[-3000:]
    write_pipeline(tmp_path, _changed(config, "rename"))
    started = time.monotonic()
    resumed = eos_subprocess("run", str(path), timeout=240)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert time.monotonic() - started < 200  # not the 600 s transaction timeout
    assert_exactly_once(sent, committed_values(bootstrap, sink))


# ---------------------------------------------------------------------------------------------
# 5. The input topic's identity
# ---------------------------------------------------------------------------------------------


def test_a_recreated_source_topic_is_refused(admin, bootstrap, unique_name, tmp_path):
    """The input topic is deleted and recreated with MORE records than the old one (so no offset
    goes backwards): the topic id gives it away."""
    source, sink = unique_name("in"), unique_name("out")
    create_topic(admin, source, 2)
    create_topic(admin, sink, 2)
    produce_numbered(bootstrap, source, 0, 300)
    path = write_pipeline(tmp_path, passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck"))
    assert eos_subprocess("run", str(path)).returncode == 0
    for future in admin.delete_topics([source], operation_timeout=30).values():
        future.result()
    _wait_for("the topic is gone", lambda: source not in admin.list_topics(timeout=10).topics)
    _wait_for("the topic is back", lambda: _recreate(admin, source))
    produce_numbered(bootstrap, source, 0, 900)
    refused = eos_subprocess("run", str(path))
    assert refused.returncode != 0
    assert "was deleted and recreated" in refused.output, refused.output[-3000:]
    assert "eos reset" in refused.output


def _recreate(admin, topic: str) -> bool:
    try:
        return create_topic(admin, topic, 2)
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------
# 7. Recovery never waits on the pipeline's own transactions
# ---------------------------------------------------------------------------------------------


def test_recovery_fences_every_producer_before_reading_any_ledger(bootstrap, new_topic, unique_name, tmp_path):
    """A sink with its own client settings plus a dead-letter queue with poison in the input:
    producers of two kinds on one cluster. kill after pre-commit (both hold open transactions on
    the ledger topic); the restart fences every one before it reads any ledger, so it does not
    wait for the (10 minute) transaction timeout."""
    import json

    from eos_connectors.kafka.clients import producer

    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), new_topic()
    out = producer({"bootstrap.servers": bootstrap})
    sent = [f"rec-{i}" for i in range(600)]
    for i, value in enumerate(sent):
        out.produce(source, json.dumps({"id": value, "grp": "g", "ts": 1000 * i}).encode(), b"k", partition=i % 2)
        if i % 30 == 0:
            out.produce(source, b"\xff\xfe not json", b"bad", partition=i % 2)
    assert out.flush(30) == 0
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    config["sources"][0].update(
        value_format={"type": "json", "schema": str(ROOT / "schemas" / "tick.avsc")}, on_error="dlq", dlq_topic=dlq
    )
    config["transforms"] = [{"name": "ids", "sql": "SELECT CAST(_key AS STRING) AS key, id AS value FROM events"}]
    config["sinks"][0]["input"] = "ids"
    config["sinks"][0]["kafka"]["config"] = {"linger.ms": 10, "transaction.timeout.ms": 600_000}
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=0")
    assert crashed.killed, crashed.output[-3000:]
    started = time.monotonic()
    run_until_done(path)
    assert time.monotonic() - started < 240
    assert len(read_all(bootstrap, dlq)) == 20  # raw (undecodable) values, each once
    assert_exactly_once(sent, committed_values(bootstrap, sink))


# ---------------------------------------------------------------------------------------------
# 11. At-least-once never drops a record
# ---------------------------------------------------------------------------------------------


def test_at_least_once_fails_instead_of_dropping_undeliverable_records(admin, bootstrap, unique_name, tmp_path):
    """The sink topic refuses the records (max.message.bytes too small). Before, at-least-once
    mode ignored delivery errors and reported success with records missing; now the epoch fails
    with the broker's reason."""
    source, sink = unique_name("in"), unique_name("out")
    create_topic(admin, source, 1)
    create_topic(admin, sink, 1, config={"max.message.bytes": "64"})
    from eos_connectors.kafka.clients import producer

    out = producer({"bootstrap.servers": bootstrap})
    for i in range(50):
        out.produce(source, b"x" * 200, f"k{i}".encode())
    assert out.flush(30) == 0
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", mode="at-least-once")
    config["sinks"][0]["kafka"]["config"] = {"compression.type": "none", "message.timeout.ms": 10_000}
    config["epochs"]["tolerable_failures"] = 0
    failed = eos_subprocess("run", str(write_pipeline(tmp_path, config)))
    assert failed.returncode != 0, failed.output[-3000:]
    assert "not delivered" in failed.output and "too large" in failed.output.lower(), failed.output[-3000:]


# ---------------------------------------------------------------------------------------------
# 4. Poison is decided by the record alone, or by an answer recorded before it routes anything
# ---------------------------------------------------------------------------------------------


def test_a_schema_id_the_registry_lacks_stops_under_fail_and_is_dead_lettered_once_under_dlq(
    spark, bootstrap, new_topic, unique_name, tmp_path
):
    """A `file:` registry that lacks schema 2 (a schema deleted, or the wrong registry). Under
    `on_error: fail` the pipeline stops at the first such record, naming the id and the way out,
    with nothing of that epoch written. Switched to `dlq` (allowed: nothing of the pending epoch
    was committed), the id is recorded as poison and its records reach the dead-letter queue
    once, with the truly corrupt record; every other record reaches the output once. (Before,
    such a record halted the pipeline under every `on_error`, until `eos reset`.) The same
    through a crash, on a real registry: tests/integration/test_registry.py."""
    import json

    import pytest

    from eos.errors import PoisonRecord
    from eos_connectors.formats.registry import FileRegistry, wire_header
    from eos_connectors.kafka.clients import producer
    from tests.pipelines import run_in_process

    v1 = {"type": "record", "name": "Tick", "namespace": "eos.test", "fields": [{"name": "id", "type": "string"}]}
    registry = tmp_path / "registry"
    FileRegistry(registry).register("ticks", v1)  # id 1; there is no id 2

    def body(record: dict) -> bytes:
        import io

        import fastavro

        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(v1), record)
        return out.getvalue()

    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), new_topic()
    out = producer({"bootstrap.servers": bootstrap})
    sent = []  # the records with id 1: the output's
    for i in range(600):
        schema_id = 2 if i >= 450 else 1
        out.produce(source, wire_header(schema_id) + body({"id": f"rec-{i}"}), f"k{i}".encode(), partition=i % 2)
        if schema_id == 1:
            sent.append(f"rec-{i}")
    out.produce(source, b"\x00\x00\x00\x00\x01\x02", b"corrupt", partition=0)  # id 1, body cut short
    assert out.flush(30) == 0
    (tmp_path / "v1.avsc").write_text(json.dumps(v1))
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=200)
    config["sources"][0].update(
        value_format={"type": "avro", "registry": "file:registry", "reader_schema": "v1.avsc"}, on_error="fail"
    )
    config["transforms"] = [{"name": "ids", "sql": "SELECT CAST(_key AS STRING) AS key, id AS value FROM events"}]
    config["sinks"][0]["input"] = "ids"
    with pytest.raises(PoisonRecord, match=r"schema id 2: no 2\.avsc") as stopped:
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert "offset 225:" in stopped.value.message  # the first record with id 2 (i = 450 or 451)
    assert "on_error: dlq" in (stopped.value.hint or "")
    config["sources"][0].update(on_error="dlq", dlq_topic=dlq)
    result = run_in_process(spark, write_pipeline(tmp_path, config))
    assert result.epochs_committed >= 2
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    dead = read_all(bootstrap, dlq)
    assert sorted(m.key().decode() for m in dead) == sorted(["corrupt", *(f"k{i}" for i in range(450, 600))])

"""The re-settable Kafka source against a real broker: starting offsets, partitions added while
running, a topic deleted while running, offsets deleted by retention."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from confluent_kafka.admin import NewPartitions

from eos_connectors.kafka.clients import admin_client
from tests.pipelines import (
    ROOT,
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)


def test_starting_offsets_latest_and_explicit(spark, bootstrap, new_topic, unique_name, tmp_path):
    source = new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 100)  # before the pipeline starts

    latest_sink = new_topic()
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, latest_sink, tmp_path / "a" / "ck")
    config["sources"][0]["kafka"]["starting_offsets"] = "latest"
    path = write_pipeline(tmp_path / "a", config)
    run_in_process(spark, path)  # pins "latest" = offsets at first start
    later = produce_numbered(bootstrap, source, 100, 50)
    run_in_process(spark, path)
    assert_exactly_once(later, committed_values(bootstrap, latest_sink))

    from_ten = new_topic()
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, from_ten, tmp_path / "b" / "ck")
    config["sources"][0]["kafka"]["starting_offsets"] = {source: {0: 10, 1: 0}}
    run_in_process(spark, write_pipeline(tmp_path / "b", config))
    everything = committed_values(bootstrap, source)  # what the topic holds, partition by partition
    from tests.support import read_all

    skipped = {m.value().decode() for m in read_all(bootstrap, source) if m.partition() == 0 and m.offset() < 10}
    assert_exactly_once([v for v in everything.elements() if v not in skipped], committed_values(bootstrap, from_ten))


def _start(path, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
    )  # fmt: skip


def _wait_for(predicate, proc, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"eos run exited while waiting for {what}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_partitions_added_while_running_are_picked_up(bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=1), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 200)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    config["epochs"]["trigger"] = "500ms"
    proc = _start(write_pipeline(tmp_path, config))
    try:
        _wait_for(lambda: sum(committed_values(bootstrap, sink).values()) == 200, proc, "the first records")
        admin = admin_client({"bootstrap.servers": bootstrap})  # kept alive until its future resolves
        admin.create_partitions([NewPartitions(source, 3)])[source].result()
        sent += produce_numbered(bootstrap, source, 200, 300)  # keys spread over all 3 partitions
        _wait_for(lambda: sum(committed_values(bootstrap, sink).values()) >= len(sent), proc, "the new partitions")
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert_exactly_once(sent, committed_values(bootstrap, sink))


def test_a_topic_deleted_while_running_stops_the_pipeline_clearly(bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=2), new_topic()
    produce_numbered(bootstrap, source, 0, 100)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    config["epochs"]["trigger"] = "500ms"
    proc = _start(write_pipeline(tmp_path, config))
    _wait_for(lambda: sum(committed_values(bootstrap, sink).values()) == 100, proc, "the first records")
    admin = admin_client({"bootstrap.servers": bootstrap})  # kept alive until its future resolves
    admin.delete_topics([source])[source].result()
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode not in (0, None), output[-3000:]
    assert f"topic '{source}' does not exist (deleted, or never created)" in output


def test_offsets_deleted_before_they_were_read(bootstrap, new_topic, unique_name, tmp_path):
    """Epoch 1's offsets are logged, then the records are deleted (retention, delete-records)
    before the restart reads them: by default a clear error; with on_out_of_range: earliest the
    pipeline skips to the log start and says what it lost."""
    from confluent_kafka import TopicPartition

    source, sink = new_topic(partitions=1), new_topic()
    produce_numbered(bootstrap, source, 0, 300)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=100)
    path = write_pipeline(tmp_path, config)
    assert eos_subprocess("run", str(path), "--failpoint", "epoch.after_offsets_logged=kill@epoch=1").killed
    admin = admin_client({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(source, 0, 150)])[TopicPartition(source, 0, 150)].result()

    refused = eos_subprocess("run", str(path))
    assert refused.returncode != 0
    assert f"offset 100 of {source}/0 is out of range" in refused.output, refused.output[-3000:]
    assert sum(committed_values(bootstrap, sink).values()) == 100  # epoch 0 only: nothing half-committed

    config["sources"][0]["kafka"]["on_out_of_range"] = "earliest"
    resumed = eos_subprocess("run", str(write_pipeline(tmp_path, config)))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "were deleted before they were read" in resumed.output and "records LOST" in resumed.output
    assert_exactly_once([f"rec-{i}" for i in [*range(100), *range(150, 300)]], committed_values(bootstrap, sink))


def test_more_slots_than_cores_runs(spark, bootstrap, new_topic, unique_name, tmp_path):
    """No barrier stage: slots need not run at once, so 5 slots on local[2] run in waves (before,
    eos refused: a barrier stage of 5 tasks could never be scheduled on 2 cores)."""
    source, sink = new_topic(partitions=5), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 1000)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", slots=5)
    result = run_in_process(spark, write_pipeline(tmp_path, config))
    assert result.epochs_committed == 2
    assert_exactly_once(sent, committed_values(bootstrap, sink))


def test_a_read_task_carries_every_field_of_its_records_and_stops_at_its_planned_end(bootstrap, new_topic, unique_name):
    """The read task's batch building on real broker messages: keys (and null keys), values,
    offsets, timestamps and headers (and messages without any) land in their columns; a range of
    transactional records, whose last offset is a commit marker, ends at its planned end."""
    import pyarrow as pa

    from eos_connectors.kafka.clients import producer
    from eos_connectors.kafka.ledger import wait_until_stable
    from eos_connectors.kafka.range_reader import range_consumer, read_range
    from eos_connectors.kafka.reader import ReaderOptions, to_arrow

    topic = new_topic()
    out = producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("t")})
    out.init_transactions(30)
    out.begin_transaction()
    sent = []
    for i in range(6):
        key = None if i == 2 else f"k{i}".encode()
        headers = [("origin", f"h{i}".encode()), ("n", None)] if i % 3 == 0 else None
        out.produce(topic, f"v{i}".encode(), key, headers=headers, timestamp=1_700_000_000_000 + i)
        sent.append((key, f"v{i}".encode(), headers))
    out.commit_transaction(30)
    end = wait_until_stable({"bootstrap.servers": bootstrap}, topic, 10)[0]
    assert end == 7  # six records and the commit marker

    reader = range_consumer({"bootstrap.servers": bootstrap})
    try:
        messages = [m for batch in read_range(reader, topic, 0, 0, end, stall_timeout_s=10) for m in batch]
    finally:
        reader.close()
    options = ReaderOptions(
        name="s", client={"bootstrap.servers": bootstrap}, topics=[topic], starting={}, topic_ids={},
        parallelism=1, on_error="fail",
    )  # fmt: skip
    batch = to_arrow(options, messages, topic, 0)
    rows = batch.to_pylist()
    assert [r["key"] for r in rows] == [k for k, _, _ in sent]
    assert [r["value"] for r in rows] == [v for _, v, _ in sent]
    assert [r["offset"] for r in rows] == list(range(6))
    assert [r["topic"] for r in rows] == [topic] * 6 and [r["partition"] for r in rows] == [0] * 6
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [1_700_000_000_000 + i for i in range(6)]
    assert [[(h["key"], h["value"]) for h in r["headers"]] for r in rows] == [h or [] for _, _, h in sent]
    assert batch.schema.field("headers").type == pa.list_(
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    )
    assert rows[0]["_eos_error"] is None

    no_headers = to_arrow(options, [m for m in messages if not m.headers()], topic, 0)
    assert no_headers.column("headers").to_pylist() == [[]] * 4


def test_the_lag_group_gets_each_committed_epoch_without_holding_up_the_next_plan(bootstrap, new_topic, unique_name):
    """Spark tells the source an epoch is committed while it plans the next one: the group commit
    for lag monitors must not run on that thread. With the group's coordinator unreachable, one
    synchronous commit held it for 45 s. On a real broker the newest ends reach the group."""
    from confluent_kafka import TopicPartition

    from eos_connectors.kafka import offsets as planning
    from eos_connectors.kafka.clients import consumer
    from eos_connectors.kafka.reader import KafkaStreamReader, ReaderOptions

    def reader(client: dict, topic: str, group: str) -> KafkaStreamReader:
        options = ReaderOptions(
            name="s", client=client, topics=[topic], starting={}, topic_ids={}, parallelism=1, on_error="fail",
            group_id=group,
        )  # fmt: skip
        return KafkaStreamReader(options)

    unreachable = reader({"bootstrap.servers": "127.0.0.1:1"}, "t", unique_name("g"))
    started = time.monotonic()
    unreachable.commit(planning.encode({("t", 0): 5}))
    assert time.monotonic() - started < 2.0
    started = time.monotonic()
    unreachable.stop()  # gives the pending commit a bounded wait, then leaves it
    assert time.monotonic() - started < 10.0

    topic, group = new_topic(partitions=2), unique_name("g")
    source = reader({"bootstrap.servers": bootstrap}, topic, group)
    source.commit(planning.encode({(topic, 0): 3, (topic, 1): 4}))
    source.commit(planning.encode({(topic, 0): 7, (topic, 1): 9}))
    source.stop()  # waits for what is pending
    monitor = consumer({"bootstrap.servers": bootstrap}, **{"group.id": group})
    try:
        committed = monitor.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        monitor.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 7, 1: 9}

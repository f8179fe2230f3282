"""A pipeline on a real broker and a real local Spark: output equals input, once."""

from __future__ import annotations

from tests.pipelines import (
    assert_exactly_once,
    committed_values,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)


def test_passthrough_copies_every_record_once(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=3), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 1200)
    config = passthrough_pipeline(
        unique_name("p"), bootstrap, source, sink, tmp_path / "ck", sql="SELECT key, upper(value) AS value FROM events"
    )
    result = run_in_process(spark, write_pipeline(tmp_path, config))
    assert result.epochs_committed >= 3  # 1200 records at <= 500 an epoch
    assert_exactly_once([v.upper() for v in sent], committed_values(bootstrap, sink))

    # A second run over the same checkpoint reads only what is new.
    more = produce_numbered(bootstrap, source, 1200, 300)
    run_in_process(spark, write_pipeline(tmp_path, config))
    assert_exactly_once([v.upper() for v in sent + more], committed_values(bootstrap, sink))


def test_consumer_group_shows_no_phantom_lag_after_a_run(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Offsets go to the group `eos-<pipeline>.<source>` for lag monitoring; after the run they
    are at the end of the last committed epoch, not one epoch behind."""
    from confluent_kafka import TopicPartition

    from eos_connectors.kafka.clients import admin_client, consumer, end_offsets

    source, sink = new_topic(partitions=2), new_topic()
    produce_numbered(bootstrap, source, 0, 700)
    name = unique_name("p")
    run_in_process(
        spark, write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    )
    group = consumer({"bootstrap.servers": bootstrap}, **{"group.id": f"eos-{name}.events"})
    committed = group.committed([TopicPartition(source, p) for p in (0, 1)], timeout=10)
    group.close()
    ends = end_offsets(admin_client({"bootstrap.servers": bootstrap}), {source: [0, 1]})
    assert {(tp.topic, tp.partition): tp.offset for tp in committed} == ends


def test_under_on_error_fail_each_record_is_read_once(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Under `fail` the poison scan (there in every mode, so that switching on_error keeps the
    checkpoint's shape) reads nothing: every record is read exactly once."""
    from eos.protocol.report import EpochListener

    class Rows(EpochListener):
        def __init__(self) -> None:
            self.per_source: list[list[int]] = []

        def on_spark_progress(self, progress):
            self.per_source.append([s["numInputRows"] for s in progress["sources"]])

    source, sink = new_topic(partitions=2), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 900)
    rows = Rows()
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    run_in_process(spark, write_pipeline(tmp_path, config), listeners=[rows])
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    assert all(len(r) == 2 for r in rows.per_source), rows.per_source  # the main scan and the poison scan
    assert sum(sum(r) for r in rows.per_source) == 900  # every record read once, by one of them

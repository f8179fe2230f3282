"""The Prometheus endpoint of a real pipeline run: scraped over HTTP while the pipeline runs,
its counters checked against what the broker really holds afterwards."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eos.observe.metrics import PipelineMetrics, PipelineShape, series_names, start_metrics_server
from eos.protocol.committer import EpochListener
from tests.pipelines import (
    all_values,
    assert_exactly_once,
    committed_values,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)
from tests.support import read_all

EPOCH_PHASES = ("plan", "read_process", "precommit", "agreement", "commit", "mark_committed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of every sample of `name` whose labels include `labels` (fails if there is none)."""
    values = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert values, f"no sample {name}{labels} in the scrape"
    return sum(values)


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, ls), v in samples.items():
        if n == name:
            key = dict(ls)[label]
            out[key] = out.get(key, 0.0) + v
    return out


class Scraper(EpochListener):
    """Scrapes the endpoint each time Spark reports a batch (after the metrics have seen it:
    the runner puts its own listeners first)."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.scrapes: list[tuple[int, Samples]] = []
        self.errors: list[str] = []

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        try:
            response = httpx.get(self.url, timeout=10)
            response.raise_for_status()
            self.scrapes.append((progress["batchId"], parse(response.text)))
        except Exception as exc:
            self.errors.append(repr(exc))

    @property
    def last(self) -> Samples:
        assert self.scrapes, f"never scraped: {self.errors}"
        return self.scrapes[-1][1]


def ledger_records(bootstrap: str, pipeline: str, isolation: str) -> int:
    prefix = f"{pipeline}/".encode()
    records = read_all(bootstrap, f"eos-ledger-{pipeline}", isolation)
    return sum(1 for r in records if r.key() and r.key().startswith(prefix) and r.value() is not None)


def test_metrics_endpoint_matches_a_real_run(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=3), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 1200)
    name = unique_name("m")
    port = free_port()
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    scraper = Scraper(port)
    result = run_in_process(spark, path, metrics_port=port, listeners=[scraper])

    assert_exactly_once(sent, committed_values(bootstrap, sink))
    assert not scraper.errors, scraper.errors
    assert [batch for batch, _ in scraper.scrapes] == list(range(result.epochs_committed))
    m = scraper.last
    epochs = result.epochs_committed
    assert epochs == 3  # 1200 records at <= 500 an epoch

    # Records: in from Spark's progress, out from the slots' reports; both equal what was produced.
    assert total(m, "eos_source_offsets_total", pipeline=name, source="events") == 1200
    # Spark's own count is per scan of the source, so at least once per record.
    assert total(m, "eos_spark_source_rows_total", pipeline=name, source="events") >= 1200
    assert total(m, "eos_sink_records_total", pipeline=name, sink="out") == 1200
    per_slot = by_label(m, "eos_slot_records_total", "slot")
    assert set(per_slot) == {"0", "1"} and sum(per_slot.values()) == 1200
    # Epochs and transactions: one committed transaction per (sink, slot) with records, each
    # carrying exactly one ledger record, which the broker shows as committed.
    assert total(m, "eos_epochs_committed_total") == epochs
    assert total(m, "eos_epoch_attempts_total") == epochs
    assert total(m, "eos_epoch_aborts_total") == total(m, "eos_epoch_retries_total") == 0
    assert total(m, "eos_transaction_commits_total") == ledger_records(bootstrap, name, "read_committed")
    assert total(m, "eos_transaction_aborts_total") == 0
    assert ledger_records(bootstrap, name, "read_uncommitted") == ledger_records(bootstrap, name, "read_committed")
    assert total(m, "eos_last_committed_epoch") == epochs - 1
    # Recovery at start-up: 1 sink x 2 slots fenced, no replay.
    assert total(m, "eos_recoveries_total", kind="startup") == 1
    assert total(m, "eos_recoveries_total", kind="retry") == 0
    assert total(m, "eos_fenced_transactional_ids_total") == 2
    assert total(m, "eos_replayed_epochs_total") == 0
    # Every phase histogram has one observation per epoch, and the work took time.
    for phase in EPOCH_PHASES:
        assert total(m, "eos_epoch_phase_duration_seconds_count", phase=phase) == epochs, phase
    assert total(m, "eos_epoch_phase_duration_seconds_bucket", phase="read_process", le="+Inf") == epochs
    assert total(m, "eos_epoch_phase_duration_seconds_sum", phase="read_process") > 0
    assert total(m, "eos_epoch_duration_seconds_count") == epochs
    assert total(m, "eos_slot_phase_duration_seconds_count", phase="produce") == 2 * epochs
    # Between epochs (each scrape happens on Spark's progress): nothing open, phase known.
    assert total(m, "eos_oldest_open_transaction_age_seconds") == 0
    assert total(m, "eos_epoch_phase", phase="between_epochs") == 1
    assert total(m, "eos_epoch_phase") == 1
    # Lag per partition after each epoch: everything produced minus what was committed so far.
    for batch, samples in scraper.scrapes:
        committed = total(samples, "eos_sink_records_total")
        lag = by_label(samples, "eos_source_lag_offsets", "partition")
        assert set(lag) == {"0", "1", "2"}, lag
        assert sum(lag.values()) == 1200 - committed, (batch, lag)
    assert total(m, "eos_lag_query_failures_total") == 0
    assert total(m, "eos_topic_lso_stuck_seconds", topic=sink) == 0

    # The server stops with the run.
    with pytest.raises(httpx.TransportError):
        httpx.get(scraper.url, timeout=2)


AVSC = {"type": "record", "name": "Event", "fields": [{"name": "n", "type": "long"}]}


def test_metrics_count_aborts_retries_and_dead_letters(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), new_topic()
    from eos_connectors.kafka.clients import producer

    writer = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    good, bad = 0, 0
    for i in range(900):
        poison = i % 45 == 0
        writer.produce(source, b"not json" if poison else json.dumps({"n": i}).encode(), f"k{i % 53}".encode())
        bad, good = bad + poison, good + (not poison)
    assert writer.flush(30) == 0
    name = unique_name("m")
    (tmp_path / "event.avsc").write_text(json.dumps(AVSC))
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=400)
    config["sources"][0].update(
        {"value_format": {"type": "json", "schema": "event.avsc"}, "on_error": "dlq", "dlq_topic": dlq}
    )
    config["sinks"][0].update({"key": "_key", "value": "cast(n AS string)"})
    port = free_port()
    scraper = Scraper(port)
    # Epoch 1, first attempt: both slots get the commit decision, then fail before committing.
    result = run_in_process(
        spark,
        write_pipeline(tmp_path, config),
        metrics_port=port,
        listeners=[scraper],
        failpoints=["sink.after_agreement=raise@epoch=1,attempt=1,times=0"],
    )
    assert not scraper.errors, scraper.errors
    assert [batch for batch, _ in scraper.scrapes] == list(range(result.epochs_committed))
    m = scraper.last
    epochs = result.epochs_committed
    assert epochs == 3

    assert sum(committed_values(bootstrap, sink).values()) == good
    assert len(read_all(bootstrap, dlq)) == bad
    assert total(m, "eos_source_offsets_total", source="events") == 900
    # Spark counts rows per scan: the dead-letter split reads the source twice, the retry again.
    assert total(m, "eos_spark_source_rows_total", source="events") > 900
    assert total(m, "eos_sink_records_total", sink="out") == good
    assert total(m, "eos_dlq_records_total", source="events") == bad
    # One failed attempt, retried after a recovery that fenced every id again.
    assert total(m, "eos_epoch_aborts_total") == total(m, "eos_epoch_retries_total") == 1
    assert total(m, "eos_epoch_attempts_total") == epochs + 1
    assert total(m, "eos_recoveries_total", kind="retry") == 1
    ids = 2 * 2  # (sink out + the DLQ) x 2 slots
    assert total(m, "eos_fenced_transactional_ids_total") == 2 * ids
    assert total(m, "eos_replayed_epochs_total") == 1
    # The transactions the broker aborted and committed are the ones the metrics counted.
    aborted = ledger_records(bootstrap, name, "read_uncommitted") - ledger_records(bootstrap, name, "read_committed")
    assert aborted >= 2
    assert total(m, "eos_transaction_aborts_total") == aborted
    assert total(m, "eos_transaction_commits_total") == ledger_records(bootstrap, name, "read_committed")
    # I6: the aborted attempt really wrote records, which read_committed readers never saw.
    assert sum(all_values(bootstrap, sink).values()) > good


def test_registries_are_per_run_and_port_zero_reports_the_bound_port():
    first, second = (PipelineMetrics(PipelineShape("same-name", sinks=["out"])) for _ in range(2))
    assert first.registry is not second.registry  # no "Duplicated timeseries" across runs
    server = start_metrics_server(first.registry, 0, addr="127.0.0.1")
    try:
        assert server.port > 0
        text = httpx.get(server.url, timeout=5).text
        assert 'eos_sink_records_total{pipeline="same-name",sink="out"} 0.0' in text
        assert "eos_oldest_open_transaction_age_seconds" in text
    finally:
        server.close()
    names = series_names(first.registry)
    assert {"eos_sink_records_total", "eos_epoch_phase_duration_seconds_bucket", "eos_epoch_phase"} <= names
    assert all(n.startswith("eos_") for n in names)


def test_a_failing_listener_does_not_stop_the_others():
    from eos.observe.progress import SparkProgressBridge

    seen: list[int] = []

    class Broken(EpochListener):
        def on_spark_progress(self, progress: dict[str, Any]) -> None:
            raise RuntimeError("boom")

    class Good(EpochListener):
        def on_spark_progress(self, progress: dict[str, Any]) -> None:
            seen.append(progress["batchId"])

    bridge = SparkProgressBridge([Broken(), Good()])
    for batch in (0, 1, 1):  # the duplicate (a late bus event after catch-up) is dropped
        bridge.deliver({"runId": "r", "batchId": batch})
    assert seen == [0, 1]

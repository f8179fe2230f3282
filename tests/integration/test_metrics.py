"""The Prometheus endpoint of real pipeline runs: scraped over HTTP while the pipeline runs, its
counters checked against what the broker, the control log and the checkpoint really hold."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eos.config import load_pipeline
from eos.declared import connectors, pipeline_info
from eos.observe.metrics import EPOCH_PHASES, PipelineMetrics, PipelineShape, series_names, start_metrics_server
from eos.protocol import recovery
from eos.protocol.checkpoint import Checkpoint
from eos.protocol.report import EpochListener
from eos_connectors.kafka.clients import producer
from eos_ops.status import read_control
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


def total(samples: Samples, name: str, missing_ok: bool = False, **labels: str) -> float:
    """Sum of every sample of `name` whose labels include `labels` (fails if there is none, unless
    missing_ok: series with a slot label appear with their first increment)."""
    values = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert values or missing_ok, f"no sample {name}{labels} in the scrape"
    return sum(values)


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, ls), v in samples.items():
        if n == name:
            key = dict(ls)[label]
            out[key] = out.get(key, 0.0) + v
    return out


def lag_settled(samples: Samples, produced: int) -> bool:
    """The lag a scrape shows is what was produced minus what was committed so far."""
    return sum(by_label(samples, "eos_source_lag_offsets", "partition").values()) == produced - total(
        samples, "eos_source_offsets_total"
    )


class Scraper(EpochListener):
    """Scrapes the endpoint each time Spark reports a batch (after the metrics have seen it: the
    runner puts its own listeners first). With `settled`, scrapes again until it holds (lag is
    queried on a background thread, right after each epoch), for at most 15 s."""

    def __init__(self, port: int, settled: Callable[[Samples], bool] | None = None):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.settled = settled
        self.scrapes: list[tuple[int, Samples]] = []
        self.errors: list[str] = []

    def scrape(self) -> Samples:
        response = httpx.get(self.url, timeout=10)
        response.raise_for_status()
        return parse(response.text)

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        try:
            samples = self.scrape()
            deadline = time.monotonic() + 15
            while self.settled is not None and not self.settled(samples) and time.monotonic() < deadline:
                time.sleep(0.1)
                samples = self.scrape()
            self.scrapes.append((progress["batchId"], samples))
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


def recorded_pools(path) -> dict[str, int]:
    """The pool sizes the control log holds (read as `eos status` reads it)."""
    config = load_pipeline(path)
    found = connectors(config, pipeline_info(config, "-", path.parent))
    return {name: pool.size for name, pool in read_control(found)["pools"].items()}


def test_metrics_endpoint_matches_a_real_run(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=3), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 1200)
    name = unique_name("m")
    port = free_port()
    path = write_pipeline(tmp_path, passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck"))
    scraper = Scraper(port, settled=lambda s: lag_settled(s, 1200))
    result = run_in_process(spark, path, metrics_port=port, listeners=[scraper])

    assert_exactly_once(sent, committed_values(bootstrap, sink))
    assert not scraper.errors, scraper.errors
    assert [batch for batch, _ in scraper.scrapes] == list(range(result.epochs_committed))
    m = scraper.last
    epochs = result.epochs_committed
    assert epochs == 3  # 1200 records at <= 500 an epoch

    # Records: in from Spark's progress (the first epoch of a new checkpoint counted from the
    # source's pinned start), out from the slots' reports; both equal what was produced.
    assert total(m, "eos_source_offsets_total", pipeline=name, source="events") == 1200
    # Spark's own count is per scan of the source, so at least once per record.
    assert total(m, "eos_spark_source_rows_total", pipeline=name, source="events") >= 1200
    assert total(m, "eos_sink_records_total", pipeline=name, sink="out") == 1200
    # Records per slot: the slots that wrote are the slots the ledger has entries for.
    per_slot = by_label(m, "eos_slot_records_total", "slot")
    keys = {r.key().decode() for r in read_all(bootstrap, f"eos-ledger-{name}")}
    ledger_slots = {key.rsplit("/", 1)[1] for key in keys if key.startswith(f"{name}/out/")}
    assert set(per_slot) == ledger_slots and sum(per_slot.values()) == 1200
    slots_per_epoch = [total(samples, "eos_epoch_slots") for _, samples in scraper.scrapes]
    assert all(1 <= n <= 2 for n in slots_per_epoch), slots_per_epoch  # 2 read tasks, one sink
    # Epochs and transactions: one committed transaction per (sink, slot) with records, each
    # carrying exactly one ledger record, which the broker shows as committed.
    assert total(m, "eos_epochs_committed_total") == epochs
    assert total(m, "eos_epoch_attempts_total") == epochs
    assert total(m, "eos_epoch_aborts_total") == total(m, "eos_epoch_retries_total") == 0
    commits = total(m, "eos_transaction_commits_total")
    assert commits == ledger_records(bootstrap, name, "read_committed") == sum(slots_per_epoch)
    assert total(m, "eos_transaction_aborts_total", missing_ok=True) == 0
    assert ledger_records(bootstrap, name, "read_uncommitted") == ledger_records(bootstrap, name, "read_committed")
    assert total(m, "eos_last_committed_epoch") == epochs - 1
    assert Checkpoint(str(tmp_path / "ck")).last_committed_epoch() == epochs - 1
    # Producers: every committed transaction had a leased id, reused or initialised; the pool
    # the gauge shows is the pool the control log recorded (ids are initialised at most once per
    # worker that holds them, and the pool only grows when every id is busy).
    reused = total(m, "eos_producer_leases_total", sink="out", lease="reused")
    initialised = total(m, "eos_producer_leases_total", sink="out", lease="initialised")
    assert reused + initialised == commits and initialised >= 1 and reused >= 1, (reused, initialised)
    pools = recorded_pools(path)
    assert by_label(m, "eos_producer_pool_size", "sink") == {"out": pools["out"]} and pools["out"] >= 2
    # Recovery at start-up: a new pipeline has no pool yet, so nothing to fence; no replay.
    assert total(m, "eos_recoveries_total", kind="startup") == 1
    assert total(m, "eos_recoveries_total", kind="retry") == 0
    assert total(m, "eos_fenced_transactional_ids_total") == 0
    assert total(m, "eos_recovery_duration_seconds_count") == 1
    assert total(m, "eos_replayed_epochs_total") == 0
    # Every phase histogram has one observation per epoch, and the work took time.
    for phase in EPOCH_PHASES:
        assert total(m, "eos_epoch_phase_duration_seconds_count", phase=phase) == epochs, phase
    assert total(m, "eos_epoch_phase_duration_seconds_bucket", phase="write", le="+Inf") == epochs
    assert total(m, "eos_epoch_phase_duration_seconds_sum", phase="write") > 0
    assert total(m, "eos_epoch_phase_duration_seconds_sum", phase="decide") > 0
    assert total(m, "eos_epoch_duration_seconds_count") == epochs
    assert total(m, "eos_slot_phase_duration_seconds_count", phase="write") == sum(slots_per_epoch)
    assert total(m, "eos_slot_phase_duration_seconds_count", phase="init") == initialised
    # The phase gauge names exactly one phase at every scrape; after the last epoch, nothing is
    # in flight and nothing is open.
    assert all(total(samples, "eos_epoch_phase") == 1 for _, samples in scraper.scrapes)
    assert total(m, "eos_epoch_phase", phase="between_epochs") == 1
    assert total(m, "eos_oldest_open_transaction_age_seconds") == 0
    # Lag per partition after each epoch: everything produced minus what was consumed up to that
    # epoch (the scrape runs on the listener bus right after the metrics took the epoch's progress;
    # records out may already count the next epoch, whose commit does not wait for the bus).
    consumed_so_far = [total(samples, "eos_source_offsets_total") for _, samples in scraper.scrapes]
    assert consumed_so_far == sorted(set(consumed_so_far)) and consumed_so_far[-1] == 1200, consumed_so_far
    for (batch, samples), consumed in zip(scraper.scrapes, consumed_so_far, strict=True):
        lag = by_label(samples, "eos_source_lag_offsets", "partition")
        assert set(lag) == {"0", "1", "2"}, lag
        assert sum(lag.values()) == 1200 - consumed, (batch, lag)
    assert sum(by_label(m, "eos_source_lag_offsets", "partition").values()) == 0
    assert total(m, "eos_lag_query_failures_total") == 0
    assert total(m, "eos_driver_fenced") == 0

    # The server stops with the run.
    with pytest.raises(httpx.TransportError):
        httpx.get(scraper.url, timeout=2)

    # A second run on the same checkpoint: start-up recovery fences every id the control log
    # recorded; records in are counted from the checkpoint's last committed epoch.
    more = produce_numbered(bootstrap, source, 1200, 300)
    port = free_port()
    again = Scraper(port, settled=lambda s: lag_settled(s, 300))
    second = run_in_process(spark, path, metrics_port=port, listeners=[again])
    assert second.epochs_committed == 1 and not again.errors, again.errors
    assert_exactly_once(sent + more, committed_values(bootstrap, sink))
    m = again.last
    assert total(m, "eos_fenced_transactional_ids_total") == sum(pools.values())
    assert total(m, "eos_source_offsets_total") == 300 == total(m, "eos_sink_records_total")
    assert total(m, "eos_last_committed_epoch") == epochs
    assert sum(by_label(m, "eos_source_lag_offsets", "partition").values()) == 0


AVSC = {"type": "record", "name": "Event", "fields": [{"name": "n", "type": "long"}]}


def test_metrics_count_aborts_retries_dead_letters_and_lingering(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), new_topic()
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
    path = write_pipeline(tmp_path, config)
    # A foreign transaction left open on the sink topic: it pins the topic's last stable offset
    # for the whole run, which the sink reports as lingering.
    zombie = producer({
        "bootstrap.servers": bootstrap, "transactional.id": unique_name("zombie"),
        "transaction.timeout.ms": 600_000,  # open for the whole run (the broker's default limit is 15 min)
    })  # fmt: skip
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(sink, b"foreign", b"k", partition=0)
    assert zombie.flush(30) == 0
    port = free_port()
    scraper = Scraper(port)
    try:
        # Epoch 1, first attempt: slot 0 fails after pre-committing, before it votes.
        result = run_in_process(
            spark,
            path,
            metrics_port=port,
            listeners=[scraper],
            failpoints=["sink.after_precommit=raise@epoch=1,slot=0,attempt=1"],
        )
        assert not scraper.errors, scraper.errors
        m = scraper.last
        lingering = by_label(m, "eos_lingering_transaction_seconds", "sink")
        assert lingering["out"] > 0 and total(m, "eos_lingering_transactions", sink="out") >= 1, lingering
    finally:
        zombie.abort_transaction(30)
    assert [batch for batch, _ in scraper.scrapes] == list(range(result.epochs_committed))
    epochs = result.epochs_committed
    assert epochs == 3

    assert sum(committed_values(bootstrap, sink).values()) == good
    assert len(read_all(bootstrap, dlq)) == bad
    assert total(m, "eos_source_offsets_total", source="events") == 900
    # Spark counts rows per scan: the dead-letter split reads the source twice, the retry again.
    assert total(m, "eos_spark_source_rows_total", source="events") > 900
    assert total(m, "eos_sink_records_total", sink="out") == good
    assert total(m, "eos_dlq_records_total", source="events") == bad
    assert total(m, "eos_slot_records_total", sink="events.dlq") == bad
    # One failed attempt, retried after a recovery that fenced every id of the recorded pools.
    assert total(m, "eos_epoch_aborts_total") == total(m, "eos_epoch_retries_total") == 1
    assert total(m, "eos_epoch_attempts_total") == epochs + 1
    assert total(m, "eos_recoveries_total", kind="retry") == 1
    pools = recorded_pools(path)
    assert set(pools) == {"out", "events.dlq"}
    # Recovery fences per group of sinks (eos.protocol.recovery.by_system), each group every id
    # of the recorded pools of its kind: the dead-letter sink is a KafkaSink subclass, a group of
    # its own, so each id is fenced twice here (reported as a core inefficiency).
    groups = recovery.by_system(
        connectors(load_pipeline(path), pipeline_info(load_pipeline(path), "-", tmp_path)).sinks
    )
    assert total(m, "eos_fenced_transactional_ids_total") == len(groups) * sum(pools.values())
    assert total(m, "eos_replayed_epochs_total") == 1
    # The transactions the metrics counted as committed are the ones the broker holds; the
    # aborted ones are those of slots that had voted prepared: every aborted transaction but
    # slot 0's own (it failed before voting, so the driver never saw it).
    committed = ledger_records(bootstrap, name, "read_committed")
    aborted = ledger_records(bootstrap, name, "read_uncommitted") - committed
    assert total(m, "eos_transaction_commits_total") == committed
    assert aborted >= 1 and total(m, "eos_transaction_aborts_total", missing_ok=True) <= aborted - 1
    # The aborted attempt really wrote records, which read_committed readers never saw.
    assert sum(all_values(bootstrap, sink).values()) > good + 1


def test_registries_are_per_run_and_port_zero_reports_the_bound_port():
    first, second = (PipelineMetrics(PipelineShape("same-name", sinks=["out"])) for _ in range(2))
    assert first.registry is not second.registry  # no "Duplicated timeseries" across runs
    server = start_metrics_server(first.registry, 0, addr="127.0.0.1")
    try:
        assert server.port > 0
        text = httpx.get(server.url, timeout=5).text
        assert 'eos_sink_records_total{pipeline="same-name",sink="out"} 0.0' in text
        assert 'eos_producer_leases_total{lease="reused",pipeline="same-name",sink="out"} 0.0' in text
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


def test_a_takeover_by_another_driver_shows_in_the_metrics(bootstrap, unique_name):
    """Two drivers of one pipeline on a real control log: the first one's metrics report that it
    was fenced once the second took over, and the first can indeed no longer record a decision."""
    from prometheus_client import generate_latest

    from eos.errors import DriverFenced
    from eos.observe.lag import DriverWatch, LagMonitor
    from eos.protocol.decision import Decision, DriverInfo
    from eos_connectors.kafka.control import KafkaControlLog

    name = unique_name("d")
    client = {"bootstrap.servers": bootstrap}
    first, second = (KafkaControlLog(client, f"eos-ledger-{name}.control", name, timeout_s=30) for _ in range(2))
    first.take_over(DriverInfo("run-a", "host-a", 1, "127.0.0.1:1"))
    monitor = LagMonitor([], [], interval_s=0.1, driver=DriverWatch(first.previous_driver, "run-a"),
                         driver_interval_s=0.2)  # fmt: skip
    metrics = PipelineMetrics(PipelineShape(name), lag=monitor)
    monitor.start()
    try:

        def fenced() -> float:
            return total(parse(generate_latest(metrics.registry).decode()), "eos_driver_fenced")

        time.sleep(1.0)  # several checks of the control log
        assert fenced() == 0
        second.take_over(DriverInfo("run-b", "host-b", 2, "127.0.0.1:2"))
        deadline = time.monotonic() + 30
        while fenced() != 1:
            assert time.monotonic() < deadline, "the takeover never showed"
            time.sleep(0.1)
        assert monitor.driver is not None and monitor.driver.taken_over_by.host == "host-b"
        with pytest.raises(DriverFenced):
            first.record_decision(Decision(0, 1, "run-a", {}))
    finally:
        monitor.stop()
        first.close()
        second.close()


def test_records_count_while_the_run_runs(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Scraped in the middle of a run: the records of the committed epochs are counted, those the
    epoch in flight has pre-committed so far show in their own gauge, and the lag shows in
    seconds. Epoch 1 is held by a slot paused after its pre-commit (before it votes): the other
    slot's vote is in, the epoch cannot commit yet."""
    from eos.failpoints import release

    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produced = time.time()
    sent = produce_numbered(bootstrap, source, 0, 900)
    name = unique_name("m")
    port = free_port()
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=300)
    path = write_pipeline(tmp_path, config)
    results: list[Any] = []
    running = threading.Thread(
        target=lambda: results.append(
            run_in_process(
                spark, path, metrics_port=port, failpoints=["sink.after_precommit=pause(120)@epoch=1,slot=1"]
            )
        ),
        daemon=True,
    )
    running.start()
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 240
    held = None
    try:
        while held is None:
            assert running.is_alive() and time.monotonic() < deadline, "epoch 1 never reached its pause"
            time.sleep(0.2)
            with contextlib.suppress(httpx.TransportError):
                samples = parse(httpx.get(url, timeout=5).text)
                epoch = total(samples, "eos_current_epoch", missing_ok=True)
                if epoch == 1 and total(samples, "eos_epoch_precommitted_records", missing_ok=True) > 0:
                    held = samples
        scraped = time.time()
    finally:
        release(tmp_path / "ck" / "_eos" / "scratch" / "failpoints")
    running.join(240)
    assert results and results[0].epochs_committed == 3
    assert_exactly_once(sent, committed_values(bootstrap, sink))

    # Before the run ended: epoch 0's records counted; epoch 1 in flight with slot 0's vote in.
    assert total(held, "eos_epochs_committed_total") == 1 and total(held, "eos_current_epoch") == 1
    assert total(held, "eos_sink_records_total", sink="out") == 300
    assert total(held, "eos_epoch_phase", phase="write") == 1
    in_flight = total(held, "eos_epoch_precommitted_records", sink="out")
    assert 0 < in_flight < 300, in_flight  # one of the epoch's two slots
    # Lag after epoch 0: 600 offsets, whose oldest records were produced before the run started.
    assert total(held, "eos_source_lag_offsets") == 600
    waited = by_label(held, "eos_source_lag_seconds", "partition")
    assert set(waited) == {"0", "1"} and all(0 < w <= scraped - produced + 1 for w in waited.values()), waited

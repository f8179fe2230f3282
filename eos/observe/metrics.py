"""Prometheus metrics of one pipeline run, served over HTTP by the driver.

Every metric is named `eos_...`, lives in a registry of its own per run (never the global
default registry, so several pipelines in one process do not clash), and carries the label
`pipeline`; `sink`, `slot`, `source`, `topic`, `partition`, `phase`, `kind`, `lease`, `outcome`
and `operation` are added where meaningful, all bounded: sinks and sources by the pipeline file,
slots by the partitions of an epoch's rows (at most the read tasks per epoch times the sinks, or
the state's shuffle partitions), partitions by the source topics, the rest by fixed sets.

Sources of truth:
- the protocol's events (`EpochListener`): epochs, attempts, phases, transactions, producer
  leases and records out come from the reports the slot tasks return with their results, folded
  by the driver (`EpochReport`), and from the coordinator's votes for a failed attempt
  (`AttemptVotes`), never from a best-effort side channel;
- Spark's own progress (`on_spark_progress`, fed by eos.observe.progress.SparkProgressBridge):
  offsets consumed and rows read per source, planning and commit-log durations;
- scrape-time state: the phase of the epoch in flight, the age of the oldest open transaction
  (eos.observe.tracker), the pools of transactional ids (the coordinator), source lag, lingering
  transactions and whether another driver took over (eos.observe.lag, on a background thread).

docs/OBSERVABILITY.md lists every metric; tests/unit/test_dashboards.py checks the dashboards and
alert rules against `series_names()` of this module's registry.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from eos import __version__
from eos.errors import EnvironmentProblem
from eos.observe.lag import DriverWatch, LagMonitor, committed_lines
from eos.observe.tracker import COMMIT, DECIDE, PHASES, WRITE, EpochTracker
from eos.protocol.report import AttemptVotes, EpochListener, EpochReport, RecoveryReport

log = logging.getLogger("eos.observe.metrics")

PREFIX = "eos"
# Epoch phases run from a millisecond (a decision on loopback) to minutes (a large first epoch).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Spark's durationMs keys that happen before the epoch's job starts: finding the end offsets
# (latestOffset), building the batch (getBatch), planning the query, and writing the offset
# log (walCommit, the barrier). Together: the "plan" phase.
PLAN_KEYS = ("latestOffset", "getBatch", "queryPlanning", "walCommit")
SPARK_KEYS = (*PLAN_KEYS, "addBatch", "commitOffsets", "triggerExecution")
EPOCH_PHASES = ("plan", "write", "decide", "commit", "mark_committed")
SLOT_PHASES = ("init", "write", "precommit")
LEASES = ("reused", "initialised")


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


@dataclass
class PipelineShape:
    """What the metrics need to know about the pipeline (label values to pre-create)."""

    pipeline: str
    parallelism: int = 1  # read tasks per epoch (fixed for a checkpoint)
    exactly_once: bool = True
    sources: list[str] = field(default_factory=list)  # in the pipeline file's order (= Spark's)
    sinks: list[str] = field(default_factory=list)  # the configured sinks
    dlq_sources: list[str] = field(default_factory=list)  # sources with on_error: dlq
    skip_sources: list[str] = field(default_factory=list)  # sources with on_error: skip
    trigger_s: float = 0.0  # 0: available-now
    epoch_timeout_s: float = 60.0

    @property
    def written(self) -> list[str]:
        """Every sink eos writes: the configured ones, then each dead-letter queue."""
        return [*self.sinks, *(f"{source}.dlq" for source in self.dlq_sources)]


class PipelineMetrics(EpochListener):
    """An EpochListener (and Spark progress consumer) that keeps a pipeline's metrics."""

    def __init__(
        self,
        shape: PipelineShape,
        tracker: EpochTracker | None = None,
        lag: LagMonitor | None = None,
        coordinator: Any = None,
        replay_epoch: int | None = None,
        last_committed: tuple[int, float | None] | None = None,
    ):
        self.shape = shape
        self.tracker = tracker
        self.lag = lag
        self.coordinator = coordinator
        self.replay_epoch = replay_epoch  # logged but uncommitted at start: its first commit is a replay
        self.registry = CollectorRegistry(auto_describe=True)
        self._epochs_started = 0
        self._define()
        self._init_children()
        self.run_started.labels(shape.pipeline).set(time.time())
        if last_committed is not None:
            self.last_epoch.labels(shape.pipeline).set(last_committed[0])
            if last_committed[1] is not None:
                self.last_committed_ts.labels(shape.pipeline).set(last_committed[1])
        self.registry.register(_ScrapeTimeCollector(self))

    # -- definitions ---------------------------------------------------------------------------
    def _define(self) -> None:
        r = self.registry
        p = ("pipeline",)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(_name(name), doc, (*p, *labels), registry=r)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(_name(name), doc, (*p, *labels), registry=r)

        def histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(_name(name), doc, (*p, *labels), registry=r, buckets=DURATION_BUCKETS)

        self.info = gauge("pipeline_info", "Always 1; the pipeline's mode, read tasks per epoch and eos version.",
                          ("mode", "parallelism", "version"))  # fmt: skip
        self.run_started = gauge("run_started_timestamp_seconds", "When this run of the pipeline started (Unix time).")
        self.trigger = gauge("trigger_interval_seconds", "The processing-time trigger interval; 0 for available-now.")
        self.epoch_timeout = gauge(
            "epoch_timeout_seconds", "epochs.timeout: an attempt's job is cancelled after this, and the commit "
            "phase waits at most this long; sink transactions are opened with a longer timeout.",
        )  # fmt: skip
        # Records
        self.offsets_in = counter(
            "source_offsets_total", "Offsets consumed per source: what committed epochs covered (end - start per "
            "partition). Equals records for topics without transactions; transaction markers and aborted records "
            "take offsets too. Counted once per epoch, however often Spark scans the source.", ("source",),
        )  # fmt: skip
        self.spark_rows = counter(
            "spark_source_rows_total", "Spark's numInputRows per source: rows its scans produced. A source read by "
            "two branches of the plan (a dead-letter or skip split) or an epoch retried counts more than once.",
            ("source",),
        )  # fmt: skip
        self.records_out = counter("sink_records_total", "Records committed to each configured sink.", ("sink",))
        self.slot_records = counter("slot_records_total", "Records committed per sink and slot (incl. DLQs).",
                                    ("sink", "slot"))  # fmt: skip
        self.dlq = counter("dlq_records_total", "Poison records committed to a source's dead-letter queue.",
                           ("source",))  # fmt: skip
        self.skipped = counter("skipped_records_total", "Poison records dropped under on_error: skip.", ("source",))
        # Epochs
        self.attempts = counter("epoch_attempts_total", "Epoch attempts started (first tries and retries).")
        self.committed = counter("epochs_committed_total", "Epochs committed.")
        self.aborted = counter("epoch_aborts_total", "Epoch attempts aborted (failed).")
        self.retried = counter("epoch_retries_total", "Aborted epoch attempts that were retried.")
        self.last_epoch = gauge("last_committed_epoch", "The last committed epoch (Spark batchId).")
        self.last_committed_ts = gauge("last_committed_timestamp_seconds", "When the last epoch committed (Unix).")
        self.slots = gauge("epoch_slots", "Slots (partitions of the epoch's rows) of the last committed epoch.")
        self.phase_s = histogram(
            "epoch_phase_duration_seconds", "Duration of each phase of committed epochs: plan (Spark: latestOffset "
            "+ getBatch + queryPlanning + walCommit), write (the Spark job: read, transform, write and pre-commit "
            "every slot), decide (recording the commit decision), commit (every slot committing), mark_committed "
            "(Spark's commit log: commitOffsets).", ("phase",),
        )  # fmt: skip
        self.epoch_s = histogram("epoch_duration_seconds", "Whole epoch, plan to commit log (triggerExecution).")
        self.slot_phase_s = histogram(
            "slot_phase_duration_seconds", "Per-slot durations of committed epochs, one observation per slot (init: "
            "per sink whose producer was initialised, not reused): init, write (reading the slot's input and "
            "writing), precommit.", ("phase",),
        )  # fmt: skip
        self.spark_s = histogram("spark_operation_duration_seconds", "Spark's per-batch durationMs, by operation.",
                                 ("operation",))  # fmt: skip
        # Transactions and recovery
        self.txn_commits = counter(
            "transaction_commits_total", "Sink transactions committed (each carries its slot's ledger entry).",
            ("sink", "slot"),
        )  # fmt: skip
        self.txn_aborts = counter(
            "transaction_aborts_total", "Pre-committed sink transactions aborted because their epoch attempt "
            "failed (the slot voted prepared; the attempt then aborted).", ("sink", "slot"),
        )  # fmt: skip
        self.leases = counter(
            "producer_leases_total", "Transactional identities leased to slots of committed epochs: reused (a live "
            "producer of the same Python worker, no init_transactions) or initialised.", ("sink", "lease"),
        )  # fmt: skip
        self.fenced = counter("fenced_transactional_ids_total", "Transactional ids fenced by recoveries (every id "
                              "of every pool: zombies lose their right to commit).")  # fmt: skip
        self.recoveries = counter("recoveries_total", "Recoveries: fence, resolve, re-read the ledgers. kind: "
                                  "startup or retry (after a failed attempt).", ("kind",))  # fmt: skip
        self.recovery_s = histogram("recovery_duration_seconds", "Time of a recovery: fencing every id, resolving "
                                    "prepared transactions, reading the ledgers.")  # fmt: skip
        self.resolved = counter("resolved_transactions_total", "Prepared transactions a recovery resolved (sinks "
                                "whose prepared transactions survive, e.g. PostgreSQL), by outcome.",
                                ("outcome",))  # fmt: skip
        self.replayed = counter("replayed_epochs_total", "Committed epochs that were replays: retried after a failed "
                                "attempt, or logged but uncommitted when the pipeline started.")  # fmt: skip
        self.replay_slots = counter("replay_skipped_slots_total", "(sink, slot) pairs skipped in a replay because "
                                    "the ledger says they already committed the epoch.")  # fmt: skip
        self.replay_records = counter("replay_skipped_records_total", "Records not written again in a replay "
                                      "(their slot had committed them already).", ("sink",))  # fmt: skip

    def _init_children(self) -> None:
        """Create the known series at 0, so rate() and increase() see the first increment."""
        s = self.shape
        p = s.pipeline
        mode = "exactly-once" if s.exactly_once else "at-least-once"
        self.info.labels(p, mode, str(s.parallelism), __version__).set(1)
        self.trigger.labels(p).set(s.trigger_s)
        self.epoch_timeout.labels(p).set(s.epoch_timeout_s)
        for metric in (self.attempts, self.committed, self.aborted, self.retried, self.fenced, self.replayed,
                       self.replay_slots):  # fmt: skip
            metric.labels(p)
        for kind in ("startup", "retry"):
            self.recoveries.labels(p, kind)
        for source in s.sources:
            self.offsets_in.labels(p, source)
            self.spark_rows.labels(p, source)
        for sink in s.sinks:
            self.records_out.labels(p, sink)
            self.replay_records.labels(p, sink)
        for source in s.dlq_sources:
            self.dlq.labels(p, source)
        for source in s.skip_sources:
            self.skipped.labels(p, source)
        if s.exactly_once:
            for sink in s.written:
                for lease in LEASES:
                    self.leases.labels(p, sink, lease)

    # -- protocol events -----------------------------------------------------------------------
    def on_recovery(self, report: RecoveryReport) -> None:
        p = self.shape.pipeline
        self.recoveries.labels(p, "retry" if self._epochs_started else "startup").inc()
        self.fenced.labels(p).inc(report.fenced_ids)
        self.recovery_s.labels(p).observe(report.duration_s)
        for outcome, n in report.resolved.items():
            self.resolved.labels(p, outcome).inc(n)

    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        self._epochs_started += 1
        self.attempts.labels(self.shape.pipeline).inc()

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        self.aborted.labels(self.shape.pipeline).inc()
        if retrying:
            self.retried.labels(self.shape.pipeline).inc()

    def on_attempt_failed(self, votes: AttemptVotes) -> None:
        p = self.shape.pipeline
        for slot, sinks in votes.prepared.items():
            counter = self.txn_commits if slot in votes.committed else self.txn_aborts
            for sink in sinks:
                counter.labels(p, sink, str(slot)).inc()

    def on_epoch_committed(self, report: EpochReport) -> None:
        p = self.shape.pipeline
        eo = self.shape.exactly_once
        self.committed.labels(p).inc()
        self.last_epoch.labels(p).set(report.epoch)
        self.last_committed_ts.labels(p).set(report.committed_at)
        self.slots.labels(p).set(len(report.slots))
        for sink, n in report.records_out.items():
            if sink.endswith(".dlq"):
                self.dlq.labels(p, sink.removesuffix(".dlq")).inc(n)
            else:
                self.records_out.labels(p, sink).inc(n)
        for name, n in report.counted_only.items():
            self.skipped.labels(p, name.removesuffix(".skipped")).inc(n)
        for sink, n in report.replay_skipped.items():
            self.replay_records.labels(p, sink).inc(n)
        self.replay_slots.labels(p).inc(report.skipped_slots)
        if report.attempts > 1 or report.skipped_slots or report.epoch == self.replay_epoch:
            self.replayed.labels(p).inc()
        self.phase_s.labels(p, "write").observe(report.job_s)
        if eo:
            self.phase_s.labels(p, "decide").observe(report.decide_s)
            self.phase_s.labels(p, "commit").observe(report.commit_s)
        for slot in report.slots:
            label = str(slot.slot)
            self.slot_phase_s.labels(p, "write").observe(slot.write_s)
            self.slot_phase_s.labels(p, "precommit").observe(slot.precommit_s)
            for sink, work in slot.sinks.items():
                if work.records:
                    self.slot_records.labels(p, sink, label).inc(work.records)
                if work.prepared is None or not eo:
                    continue
                self.txn_commits.labels(p, sink, label).inc()
                self.leases.labels(p, sink, "reused" if work.reused else "initialised").inc()
                if not work.reused:
                    self.slot_phase_s.labels(p, "init").observe(work.init_s)

    # -- Spark's progress ----------------------------------------------------------------------
    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        p = self.shape.pipeline
        durations = progress.get("durationMs") or {}
        if "triggerExecution" in durations:
            self.epoch_s.labels(p).observe(durations["triggerExecution"] / 1000)
        self.phase_s.labels(p, "plan").observe(sum(durations.get(k, 0) for k in PLAN_KEYS) / 1000)
        if "commitOffsets" in durations:
            self.phase_s.labels(p, "mark_committed").observe(durations["commitOffsets"] / 1000)
        for key in SPARK_KEYS:
            if key in durations:
                self.spark_s.labels(p, key).observe(durations[key] / 1000)
        # Spark reports every scan of the query (a source's poison scan, SQL that reads a view
        # twice): each scan's rows count toward the source whose offsets it reports.
        reported = progress.get("sources") or []
        owners = self.lag.owner_of if self.lag is not None else None
        for index, scan in enumerate(reported):
            name = owners(scan.get("endOffset")) if owners else None
            if name is None and owners is None and index < len(self.shape.sources):
                name = self.shape.sources[index]
            if name is not None:
                self.spark_rows.labels(p, name).inc(max(0, int(scan.get("numInputRows") or 0)))
        if self.lag is not None:
            for name, n in self.lag.on_progress(progress).items():
                self.offsets_in.labels(p, name).inc(n)


class _ScrapeTimeCollector:
    """Values computed when Prometheus scrapes: the epoch's phase, open transaction age, pools,
    lag, lingering transactions, a takeover by another driver."""

    def __init__(self, metrics: PipelineMetrics):
        self.m = metrics

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from self._families(with_samples=True)

    def _families(self, with_samples: bool = False) -> Iterator[Metric]:
        pipeline = self.m.shape.pipeline
        tracker, lag, coordinator = self.m.tracker, self.m.lag, self.m.coordinator
        age = GaugeMetricFamily(
            _name("oldest_open_transaction_age_seconds"),
            "Seconds since the oldest sink transaction of this pipeline that may still be open began (measured "
            "from its epoch attempt's start; 0 when none is open).",
            labels=["pipeline"],
        )
        phase = GaugeMetricFamily(
            _name("epoch_phase"), "1 for the phase the pipeline is in now, 0 for the others.",
            labels=["pipeline", "phase"],
        )  # fmt: skip
        current = GaugeMetricFamily(_name("current_epoch"), "The epoch in flight (or the last one).",
                                    labels=["pipeline"])  # fmt: skip
        pools = GaugeMetricFamily(
            _name("producer_pool_size"), "Transactional identities in each sink's pool (ids 0..size-1 were handed "
            "out; the pool grows when every id is busy, and recovery fences all of them).", labels=["pipeline", "sink"],
        )  # fmt: skip
        lag_family = GaugeMetricFamily(
            _name("source_lag_offsets"), "Newest readable offset of each source partition (the last stable offset "
            "for read_committed sources) minus the end offset of the last committed epoch.",
            labels=["pipeline", "source", "topic", "partition"],
        )  # fmt: skip
        lag_seconds = GaugeMetricFamily(
            _name("source_lag_seconds"), "How long the oldest record of each source partition that no committed "
            "epoch covers yet has waited: now minus its Kafka timestamp (0 when the partition does not lag; left "
            "out while its timestamp cannot be read).", labels=["pipeline", "source", "topic", "partition"],
        )  # fmt: skip
        precommitted = GaugeMetricFamily(
            _name("epoch_precommitted_records"), "Records in the sink transactions the epoch in flight has "
            "pre-committed so far (slots that voted prepared; 0 between epochs): they count in "
            "eos_sink_records_total once the epoch commits. Sinks whose slots do not vote (PostgreSQL) show 0.",
            labels=["pipeline", "sink"],
        )  # fmt: skip
        lingering = GaugeMetricFamily(
            _name("lingering_transaction_seconds"), "How long the oldest transaction the sink reports as left open "
            "(SinkConnector.lingering(): for Kafka, a sink or ledger topic partition whose last stable offset is "
            "stuck below its high watermark) has stayed; 0 when none.", labels=["pipeline", "sink"],
        )  # fmt: skip
        lingering_n = GaugeMetricFamily(
            _name("lingering_transactions"), "Open transactions (Kafka: pinned partitions) each sink reports now.",
            labels=["pipeline", "sink"],
        )  # fmt: skip
        taken_over = GaugeMetricFamily(
            _name("driver_fenced"), "1 once the control log shows that another driver took the pipeline over: this "
            "driver can no longer commit and stops at its next decision; 0 otherwise (checked every 30 s).",
            labels=["pipeline"],
        )  # fmt: skip
        failures = CounterMetricFamily(_name("lag_query_failures"), "Failed source lag queries (lag is stale).",
                                       labels=["pipeline"])  # fmt: skip
        if with_samples:
            if tracker is not None:
                age.add_metric([pipeline], tracker.oldest_open_transaction_s())
                now = tracker.phase()
                for name in PHASES:
                    phase.add_metric([pipeline, name], 1.0 if name == now.name else 0.0)
                if now.epoch is not None:
                    current.add_metric([pipeline], now.epoch)
                in_flight: dict[str, int] = {}
                if now.name in (WRITE, DECIDE, COMMIT) and now.epoch is not None and coordinator is not None:
                    for vote in coordinator.votes(now.epoch, now.attempt):
                        in_flight[vote.sink] = in_flight.get(vote.sink, 0) + vote.records
                for sink in self.m.shape.written:
                    precommitted.add_metric([pipeline, sink], in_flight.get(sink, 0))
            if coordinator is not None:
                for sink, size in sorted(coordinator.pool_sizes().items()):
                    pools.add_metric([pipeline, sink], size)
            if lag is not None:
                scraped = time.time()
                for row in lag.snapshot():
                    labels = [pipeline, row.source, row.topic, str(row.partition)]
                    lag_family.add_metric(labels, row.lag)
                    if not row.lag or row.oldest is not None:
                        lag_seconds.add_metric(labels, max(0.0, scraped - row.oldest) if row.lag else 0.0)
                for sink, seconds in lag.lingering.stuck_seconds().items():
                    lingering.add_metric([pipeline, sink], seconds)
                for sink, n in lag.lingering.counts().items():
                    lingering_n.add_metric([pipeline, sink], n)
                failures.add_metric([pipeline], lag.failures)
                if lag.driver is not None:
                    taken_over.add_metric([pipeline], 1.0 if lag.driver.taken_over_by is not None else 0.0)
        yield from (age, phase, current, precommitted, pools, lag_family, lag_seconds, lingering, lingering_n,
                    taken_over, failures)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------------------------


@dataclass
class MetricsServer:
    host: str
    port: int
    _server: Any
    _thread: Any

    @property
    def url(self) -> str:
        """Where this machine reaches it (loopback when it listens on every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` at http://addr:port/metrics on a daemon thread; port 0 picks a free port
    (MetricsServer.port is the one bound). Loopback unless `addr` says otherwise: the page answers
    anyone who reaches it."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(addr, server.server_port, server, thread)


def series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can export (what PromQL may select): counters as
    `_total`, histograms as `_bucket`/`_sum`/`_count`, gauges as they are."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


# ---------------------------------------------------------------------------------------------
# Wiring for a run (eos.runner)
# ---------------------------------------------------------------------------------------------


def committed_at(checkpoint: Any, epoch: int) -> float | None:
    """When Spark wrote the commit log entry of `epoch` (the file's modification time)."""
    try:
        if checkpoint.local is not None:
            return (checkpoint.local / "commits" / str(epoch)).stat().st_mtime
        files = checkpoint.files
        return files.fs.getFileStatus(files._path(f"commits/{epoch}")).getModificationTime() / 1000
    except Exception:  # monitoring only
        return None


@dataclass
class Telemetry:
    """The observers of one run: phase tracker, lag monitor, metrics and their HTTP server."""

    tracker: EpochTracker
    lag: LagMonitor | None = None
    metrics: PipelineMetrics | None = None
    server: MetricsServer | None = None
    closing: list[Any] = field(default_factory=list)

    @property
    def listeners(self) -> list[EpochListener]:
        return [self.tracker, *([self.metrics] if self.metrics else [])]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.lag is not None:
            self.lag.stop()
        for item in self.closing:
            try:
                item.close()
            except Exception:
                log.debug("closing %s failed", type(item).__name__, exc_info=True)
        self.closing = []


def shape_of(config: Any, found: Any, parallelism: int) -> PipelineShape:
    return PipelineShape(
        pipeline=config.name,
        parallelism=parallelism,
        exactly_once=config.exactly_once,
        sources=[s.name for s in found.sources],
        sinks=[s.name for s in config.sinks],
        dlq_sources=[s.name for s in found.sources if f"{s.name}.dlq" in {k.name for k in found.sinks}],
        skip_sources=[s.name for s in found.sources if s.entry.on_error == "skip"],
        trigger_s=config.epochs.trigger_seconds or 0.0,
        epoch_timeout_s=config.epochs.timeout,
    )


def start_telemetry(
    config: Any,
    found: Any,
    checkpoint: Any,
    coordinator: Any,
    metrics_port: int | None,
    lag: bool,
    host: str | None = None,
) -> Telemetry:
    """Set up the observers of a run: the phase tracker always; the lag monitor (sources' lag,
    sinks' lingering transactions) for the progress lines or the metrics; the metrics and their
    HTTP server if metrics_port is not None, on `host` (default: metrics.host of the config)."""
    telemetry = Telemetry(EpochTracker(config.exactly_once, coordinator))
    if not lag and metrics_port is None:
        return telemetry
    meta = checkpoint.read_meta()
    try:
        lines = committed_lines(checkpoint, found.sources, meta.sources if meta else None)
    except Exception as exc:  # a corrupt offset log stops the run elsewhere, not here
        log.warning("source lag: %s", exc)
        lines = [None] * len(found.sources)
    driver = None
    if metrics_port is not None and config.exactly_once and coordinator is not None:
        control = found.sources[0].control_log()
        telemetry.closing.append(control)
        driver = DriverWatch(control.previous_driver, str(coordinator.identity.get("run", "")))
    # The lingering and takeover watches feed only the metrics; the progress lines need the lag.
    watched = found.sinks if config.exactly_once and metrics_port is not None else ()
    telemetry.lag = LagMonitor(found.sources, lines, sinks=watched, driver=driver)
    telemetry.lag.start()
    if metrics_port is None:
        return telemetry
    last = checkpoint.last_committed_epoch()
    parallelism = int((meta.replay if meta else {}).get("parallelism") or config.epochs.slots or 0)
    telemetry.metrics = PipelineMetrics(
        shape_of(config, found, parallelism),
        telemetry.tracker,
        telemetry.lag,
        coordinator,
        replay_epoch=checkpoint.pending_replay(),
        last_committed=(last, committed_at(checkpoint, last)) if last is not None else None,
    )
    host = host or config.metrics.host
    try:
        telemetry.server = start_metrics_server(telemetry.metrics.registry, metrics_port, host)
    except OSError as exc:
        telemetry.close()
        raise EnvironmentProblem(
            f"metrics: cannot listen on {host} port {metrics_port}: {exc}",
            hint="choose another --metrics-port (0: any), or a --metrics-host of this machine",
        ) from None
    print(f"eos: metrics of {config.name} at {telemetry.server.url}", file=sys.stderr)
    return telemetry

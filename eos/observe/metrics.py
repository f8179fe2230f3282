"""Prometheus metrics of one pipeline run, served over HTTP by the driver.

Every metric is named `eos_...`, lives in a registry of its own per run (never the global
default registry, so several pipelines in one process do not clash), and carries the label
`pipeline`; `sink`, `slot`, `source`, `topic`, `partition`, `phase` and `kind` are added where
meaningful, all bounded (slots by the checkpoint's slot count, partitions by the topics).

Sources of truth:
- the protocol's events (`EpochListener`): epochs, attempts, transactions and records out come
  from the reports the sink tasks return with their results, folded by the driver, never from a
  best-effort side channel;
- Spark's own progress (`on_spark_progress`, fed by eos.observe.progress.SparkProgressBridge): records
  in per source, planning and commit-log durations;
- scrape-time state: the phase of the epoch in flight and the age of the oldest open
  transaction (eos.observe.tracker), source lag and stuck last stable offsets (eos_connectors.kafka.lag).

docs/OBSERVABILITY.md lists every metric; tests/test_dashboards.py checks the dashboards and
alert rules against `series_names()` of this module's registry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

LagMonitor = Any  # rewired below
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from eos import __version__
from eos.errors import EnvironmentProblem
from eos.observe.tracker import PHASES, EpochTracker
from eos.protocol.report import AttemptVotes, EpochListener, EpochReport, RecoveryReport

log = logging.getLogger("eos.observe.metrics")

PREFIX = "eos"
# Epoch phases run from a millisecond (agreement on loopback) to minutes (a large first epoch).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Spark's durationMs keys that happen before the sink job starts: finding the end offsets
# (latestOffset), building the batch (getBatch), planning the query, and writing the offset
# log (walCommit, the barrier). Together: the "plan" phase.
PLAN_KEYS = ("latestOffset", "getBatch", "queryPlanning", "walCommit")
SPARK_KEYS = (*PLAN_KEYS, "addBatch", "commitOffsets", "triggerExecution")
EPOCH_PHASES = ("plan", "read_process", "precommit", "agreement", "commit", "mark_committed")
SLOT_PHASES = ("init", "produce", "flush", "vote", "commit")


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


@dataclass
class PipelineShape:
    """What the metrics need to know about the pipeline (label values to pre-create, limits)."""

    pipeline: str
    slots: int = 1
    exactly_once: bool = True
    sources: list[str] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)  # the user's sinks
    dlq_sources: list[str] = field(default_factory=list)  # sources with on_error: dlq
    skip_sources: list[str] = field(default_factory=list)  # sources with on_error: skip
    trigger_s: float = 0.0  # 0: available-now
    transaction_timeout_s: float = 60.0


class PipelineMetrics(EpochListener):
    """An EpochListener (and Spark progress consumer) that keeps a pipeline's metrics."""

    def __init__(
        self,
        shape: PipelineShape,
        tracker: EpochTracker | None = None,
        lag: LagMonitor | None = None,
        config: Any = None,
        replay_epoch: int | None = None,
        last_committed: tuple[int, float] | None = None,
    ):
        self.shape = shape
        self.tracker = tracker
        self.lag = lag
        self.config = config  # PipelineConfig: maps Spark's sources to names
        self.replay_epoch = replay_epoch  # logged but uncommitted at start: its first commit is a replay
        self.registry = CollectorRegistry(auto_describe=True)
        self._epochs_started = 0
        self._define()
        self._init_children()
        self.run_started.labels(shape.pipeline).set(time.time())
        if last_committed is not None:
            self.last_epoch.labels(shape.pipeline).set(last_committed[0])
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

        self.info = gauge("pipeline_info", "Always 1; the pipeline's mode, slot count and eos version.",
                          ("mode", "slots", "version"))  # fmt: skip
        self.run_started = gauge("run_started_timestamp_seconds", "When this run of the pipeline started (Unix time).")
        self.trigger = gauge("trigger_interval_seconds", "The processing-time trigger interval; 0 for available-now.")
        self.txn_timeout = gauge(
            "transaction_timeout_seconds", "transaction.timeout.ms of the sink producers: the broker aborts a "
            "transaction open longer than this.",
        )  # fmt: skip
        # Records
        self.offsets_in = counter(
            "source_offsets_total", "Offsets consumed per source: what committed epochs covered (end - start per "
            "partition). Equals records for topics without transactions; transaction markers and aborted records "
            "take offsets too. Counted once per epoch, however often Spark scans the source.", ("source",),
        )  # fmt: skip
        self.spark_rows = counter(
            "spark_source_rows_total", "Spark's numInputRows per source: rows its scans produced. A source read by "
            "several branches of the plan (a dead-letter split, two sinks) or an epoch retried counts more than "
            "once.", ("source",),
        )  # fmt: skip
        self.records_out = counter("sink_records_total", "Records committed to each sink's topic.", ("sink",))
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
        self.phase_s = histogram(
            "epoch_phase_duration_seconds", "Duration of each phase of committed epochs: plan (Spark: latestOffset "
            "+ getBatch + queryPlanning + walCommit), read_process, precommit, agreement, commit, mark_committed "
            "(Spark's commit log: commitOffsets).", ("phase",),
        )  # fmt: skip
        self.vote_wait_s = histogram("epoch_vote_wait_seconds", "How long the slowest slot waited for the decision.")
        self.epoch_s = histogram("epoch_duration_seconds", "Whole epoch, plan to commit log (triggerExecution).")
        self.slot_phase_s = histogram("slot_phase_duration_seconds", "Per-slot durations (init_transactions, "
                                      "produce, flush, vote, commit), one observation per slot and epoch.",
                                      ("phase",))  # fmt: skip
        self.spark_s = histogram("spark_operation_duration_seconds", "Spark's per-batch durationMs, by operation.",
                                 ("operation",))  # fmt: skip
        # Transactions and recovery
        self.txn_commits = counter("transaction_commits_total", "Sink transactions committed.", ("sink", "slot"))
        self.txn_aborts = counter(
            "transaction_aborts_total", "Pre-committed sink transactions aborted because their epoch attempt "
            "failed (the slot voted prepared; the attempt then aborted).", ("sink", "slot"),
        )  # fmt: skip
        self.fenced = counter("fenced_transactional_ids_total", "Transactional ids fenced (init_transactions by "
                              "the driver at recovery: zombies lose their right to commit).")  # fmt: skip
        self.recoveries = counter("recoveries_total", "Recoveries: fence every id, re-read the ledger. kind: startup "
                                  "or retry (after a failed attempt).", ("kind",))  # fmt: skip
        self.fence_s = histogram("recovery_fence_duration_seconds", "Time to fence every transactional id.")
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
        self.info.labels(p, "exactly-once" if s.exactly_once else "at-least-once", str(s.slots), __version__).set(1)
        self.trigger.labels(p).set(s.trigger_s)
        self.txn_timeout.labels(p).set(s.transaction_timeout_s)
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
        written = [*s.sinks, *(f"{src}.dlq" for src in s.dlq_sources)]
        for sink in written:
            for slot in range(s.slots):
                self.slot_records.labels(p, sink, str(slot))
                if s.exactly_once:
                    self.txn_commits.labels(p, sink, str(slot))
                    self.txn_aborts.labels(p, sink, str(slot))

    # -- protocol events -----------------------------------------------------------------------
    def on_recovery(self, report: RecoveryReport) -> None:
        p = self.shape.pipeline
        self.recoveries.labels(p, "retry" if self._epochs_started else "startup").inc()
        self.fenced.labels(p).inc(report.fenced_ids)
        if report.fenced_ids:
            self.fence_s.labels(p).observe(report.fence_s)

    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        self._epochs_started += 1
        self.attempts.labels(self.shape.pipeline).inc()

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        self.aborted.labels(self.shape.pipeline).inc()
        if retrying:
            self.retried.labels(self.shape.pipeline).inc()

    def on_attempt_failed(self, votes: AttemptVotes) -> None:
        p = self.shape.pipeline
        for slot, records in votes.prepared.items():
            counter = self.txn_commits if slot in votes.committed else self.txn_aborts
            for sink in records:
                counter.labels(p, sink, str(slot)).inc()

    def on_epoch_committed(self, report: EpochReport) -> None:
        p = self.shape.pipeline
        self.committed.labels(p).inc()
        self.last_epoch.labels(p).set(report.epoch)
        self.last_committed_ts.labels(p).set(report.committed_at)
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
        phases = {
            "read_process": report.read_process_s,
            "precommit": report.precommit_s,
            "agreement": report.agreement_s,
            "commit": report.commit_s if self.shape.exactly_once else None,
        }
        for phase, seconds in phases.items():
            if seconds is not None:
                self.phase_s.labels(p, phase).observe(seconds)
        if self.shape.exactly_once:
            self.vote_wait_s.labels(p).observe(report.vote_wait_s)
        for slot_report in report.slot_reports:
            self._slot(slot_report)

    def _slot(self, report: dict[str, Any]) -> None:
        p, slot = self.shape.pipeline, str(report["slot"])
        for sink, n in report.get("records", {}).items():
            self.slot_records.labels(p, sink, slot).inc(n)
            if self.shape.exactly_once:  # one transaction per sink with records in this slot
                self.txn_commits.labels(p, sink, slot).inc()
        for phase in SLOT_PHASES:
            seconds = report.get(f"{phase}_s")
            if seconds is not None:
                self.slot_phase_s.labels(p, phase).observe(seconds)

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
        sources = progress.get("sources") or []
        ends = [s.get("endOffset") for s in sources]
        names = source_names(self.config, ends) if self.config is not None else [None] * len(sources)
        for source, name in zip(sources, names, strict=True):
            self.spark_rows.labels(p, name or "unknown").inc(max(0, int(source.get("numInputRows") or 0)))
        if self.lag is not None:
            for name, n in self.lag.on_progress(progress).items():
                self.offsets_in.labels(p, name).inc(n)


class _ScrapeTimeCollector:
    """Values computed when Prometheus scrapes: the epoch's phase, open transaction age, lag."""

    def __init__(self, metrics: PipelineMetrics):
        self.m = metrics

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from self._families(with_samples=True)

    def _families(self, with_samples: bool = False) -> Iterator[Metric]:
        pipeline = self.m.shape.pipeline
        tracker, lag = self.m.tracker, self.m.lag
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
        lag_family = GaugeMetricFamily(
            _name("source_lag_offsets"), "End offset of each source partition (LSO for read_committed sources) "
            "minus the end offset of the last committed epoch.", labels=["pipeline", "source", "topic", "partition"],
        )  # fmt: skip
        stuck = GaugeMetricFamily(
            _name("topic_lso_stuck_seconds"), "How long the topic's last stable offset has been stuck below its high "
            "watermark (an open transaction pins it; every read_committed reader waits). Sink and ledger topics.",
            labels=["pipeline", "topic"],
        )  # fmt: skip
        failures = CounterMetricFamily(_name("lag_query_failures"), "Failed end-offset queries for lag monitoring.",
                                       labels=["pipeline"])  # fmt: skip
        if with_samples:
            if tracker is not None:
                age.add_metric([pipeline], tracker.oldest_open_transaction_s())
                now = tracker.phase()
                for name in PHASES:
                    phase.add_metric([pipeline, name], 1.0 if name == now.name else 0.0)
                if now.epoch is not None:
                    current.add_metric([pipeline], now.epoch)
            if lag is not None:
                for row in lag.snapshot():
                    lag_family.add_metric([pipeline, row.source, row.topic, str(row.partition)], row.lag)
                for topic, seconds in lag.stable.stuck_seconds().items():
                    stuck.add_metric([pipeline, topic], seconds)
                failures.add_metric([pipeline], lag.failures)
        yield from (age, phase, current, lag_family, stuck, failures)


# ---------------------------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------------------------


@dataclass
class MetricsServer:
    port: int
    _server: Any
    _thread: Any

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve `registry` at http://addr:port/metrics on a daemon thread; port 0 picks a free port
    (MetricsServer.port is the one bound)."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server.server_port, server, thread)


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


def transaction_timeout_s(targets: Iterable[Any], epoch_timeout_s: float) -> float:
    """The smallest transaction.timeout.ms of the sink producers (eos_connectors.kafka.sink's rule:
    max(60 s, twice the epoch timeout) unless the sink's client config sets it)."""
    default = max(60.0, 2 * epoch_timeout_s)
    values = [float(t.client.get("transaction.timeout.ms", default * 1000)) / 1000 for t in targets if t.topic]
    return min(values, default=default)


@dataclass
class Telemetry:
    """The observers of one run: phase tracker, lag monitor, metrics and their HTTP server."""

    tracker: EpochTracker
    lag: LagMonitor | None = None
    metrics: PipelineMetrics | None = None
    server: MetricsServer | None = None

    @property
    def listeners(self) -> list[EpochListener]:
        return [self.tracker, *([self.metrics] if self.metrics else [])]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.lag is not None:
            self.lag.stop()


def start_telemetry(
    config: Any,
    found: Any,
    checkpoint: Any,
    coordinator: Any,
    metrics_port: int | None,
    lag: bool,
) -> Telemetry:
    """Set up the observers of a run; starts the metrics server if metrics_port is not None."""
    telemetry = Telemetry(EpochTracker(0, config.exactly_once, coordinator))
    if metrics_port is None:
        return telemetry
    raise EnvironmentProblem("metrics are being rewired to the new protocol")

"""The two benchmark pipelines as eos pipeline configs, and running them in this process.

- stateless: Avro decode -> filter/project (SQL) -> Avro encode (bench/schemas/ad_view.avsc);
- stateful: the demo's pipeline, examples/ad_attribution.yaml (dedup within the watermark, clicks
  and impressions per campaign per minute), with only its names, topics and sizes changed.

Runs use the benchmark's warm SparkSession (runner.run_config with RunOptions(spark=...)), so
JVM start-up is not part of a run; each run gets its own name, checkpoint and output topic.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import CpuMeter
from eos.config import pipeline_from_yaml
from eos.paths import examples_dir
from eos.protocol.report import EpochListener, EpochReport, RecoveryReport
from eos.yamlsource import parse_yaml

BENCH_DIR = Path(__file__).resolve().parent
OUTPUT_SCHEMA = str(BENCH_DIR / "schemas" / "ad_view.avsc")
STATELESS_SQL = (
    "SELECT event_id, campaign_id, CAST(event_type AS STRING) AS event_type, event_time FROM events "
    "WHERE event_type <> 'heartbeat' AND campaign_id <> 'campaign-00'"
)
# Spark durationMs keys before the sink job starts (as eos.observe.metrics.PLAN_KEYS).
PLAN_KEYS = ("latestOffset", "getBatch", "queryPlanning", "walCommit")


def stateless_config(
    name: str,
    bootstrap: str,
    topic: str,
    out_topic: str,
    checkpoint: Path,
    mode: str,
    epoch_records: int | None,
    trigger: str = "available-now",
    out_partitions: int = 4,
) -> dict[str, Any]:
    source_kafka: dict[str, Any] = {"bootstrap": bootstrap, "topics": [topic]}
    if epoch_records:
        source_kafka["max_records_per_epoch"] = epoch_records
    return {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"mode": mode, "trigger": trigger, "slots": 2, "timeout": "120s"},
        "sources": [
            {
                "name": "events",
                "kafka": source_kafka,
                "key_format": "string",
                "value_format": {"type": "avro", "schema": "ad_event.avsc"},
            },
        ],
        "transforms": [{"name": "views", "sql": STATELESS_SQL}],
        "sinks": [
            {
                "name": "out",
                "kafka": {
                    "bootstrap": bootstrap,
                    "topic": out_topic,
                    "create_topic": True,
                    "partitions": out_partitions,
                },
                "key": "event_id",
                "value_format": {"type": "avro", "schema": OUTPUT_SCHEMA},
            },
        ],
    }


def stateful_config(
    name: str,
    bootstrap: str,
    topic: str,
    out_topic: str,
    checkpoint: Path,
    mode: str,
    epoch_records: int | None,
    trigger: str = "available-now",
    out_partitions: int = 2,
) -> dict[str, Any]:
    """examples/ad_attribution.yaml with the benchmark's names, topics, mode and epoch size."""
    config = yaml.safe_load((examples_dir() / "ad_attribution.yaml").read_text())
    config["name"] = name
    config["checkpoint"] = str(checkpoint)
    config["epochs"].update({"mode": mode, "trigger": trigger, "timeout": "120s"})
    source = config["sources"][0]["kafka"]
    source.update({"bootstrap": bootstrap, "topics": [topic]})
    source.pop("max_records_per_epoch", None)
    if epoch_records:
        source["max_records_per_epoch"] = epoch_records
    # The Kafka sink only: the demo's PostgreSQL table is not what Spark's built-in connector (the
    # baseline) writes, and a second sink of the view would read the input twice.
    config["sinks"] = [config["sinks"][0]]
    sink = config["sinks"][0]["kafka"]
    sink.update({"bootstrap": bootstrap, "topic": out_topic, "create_topic": True, "partitions": out_partitions})
    return config


def config_for(pipeline: str, **kwargs: Any) -> dict[str, Any]:
    return (stateless_config if pipeline == "stateless" else stateful_config)(**kwargs)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# Running in this process
# ---------------------------------------------------------------------------------------------


class Collector(EpochListener):
    """Keeps every epoch's report, Spark's progress of every batch, and when things happened."""

    def __init__(self) -> None:
        self.reports: dict[int, EpochReport] = {}
        self.progress: dict[int, dict[str, Any]] = {}
        self.started: dict[int, float] = {}
        self.committed_at: dict[int, float] = {}
        self.recoveries: list[RecoveryReport] = []
        self.aborted: list[tuple[int, int, str]] = []
        self.recovered_at: float | None = None
        self.phases: dict[int, dict[str, float]] = {}

    def on_recovery(self, report: RecoveryReport) -> None:
        self.recoveries.append(report)
        self.recovered_at = time.time()

    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        self.started.setdefault(epoch, time.monotonic())

    def on_epoch_committed(self, report: EpochReport) -> None:
        self.reports[report.epoch] = report
        self.committed_at[report.epoch] = time.monotonic()

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        self.aborted.append((epoch, attempt, reason))

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        self.progress[int(progress.get("batchId", -1))] = progress

    def on_phase(self, epoch: int, attempt: int, phase: str) -> None:
        self.phases.setdefault(epoch, {})[phase] = time.monotonic()

    def epochs(self) -> list[dict[str, Any]]:
        """One row per committed epoch: Spark's durations and the protocol's phases, in seconds.

        The protocol's phases (eos.protocol.report): `job_s` is the Spark job (read, decode,
        transform, encode, produce and pre-commit of every slot, in one stage), `decide_s` the
        durable commit decision, `commit_s` until every slot's commit is reported. Per slot:
        `write_s` (reading its input and producing) and `precommit_s` (ledger record + flush)."""
        rows = []
        for epoch, report in sorted(self.reports.items()):
            durations = self.progress.get(epoch, {}).get("durationMs", {})
            slots = report.slots
            works = [w for s in slots for w in s.sinks.values()]
            # The slot that finished last decides when the job ends.
            last = max(slots, key=lambda s: s.write_s + s.precommit_s) if slots else None
            protocol_s = report.job_s + report.decide_s + report.commit_s
            add_batch_s = durations.get("addBatch", 0) / 1000
            rows.append(
                {
                    "epoch": epoch,
                    "records_out": sum(report.records_out.values()),
                    "input_rows": self.progress.get(epoch, {}).get("numInputRows"),
                    "trigger_s": durations.get("triggerExecution", 0) / 1000,
                    "plan_s": sum(durations.get(k, 0) for k in PLAN_KEYS) / 1000,
                    "add_batch_s": add_batch_s,
                    "mark_s": durations.get("commitOffsets", 0) / 1000,
                    "job_s": report.job_s,
                    "decide_s": report.decide_s,
                    "commit_s": report.commit_s,
                    # foreachBatch around the protocol: planning the attempt, listeners, reports
                    "driver_s": max(0.0, add_batch_s - protocol_s),
                    "slots": len(slots),
                    "write_s": last.write_s if last else 0.0,
                    "precommit_s": last.precommit_s if last else 0.0,
                    "write_min_s": min((s.write_s for s in slots), default=0.0),
                    "init_s": max((w.init_s for w in works), default=0.0),
                    "init_sum_s": sum(w.init_s for w in works),
                    "producers_reused": sum(bool(w.reused) for w in works if w.prepared is not None),
                    "producers_created": sum(not w.reused for w in works if w.prepared is not None),
                    "by_owner": sum(bool(w.by_owner) for w in works),
                    "txn_commits": report.txn_commits,
                    "attempts": report.attempts,
                    "slot_records": [sum(w.records for w in s.sinks.values()) for s in slots],
                }
            )
        return rows


def _iso(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def run_spans(progress: list[dict[str, Any]], started: float, ended: float) -> dict[str, float]:
    """Where a run's wall time went outside its epochs (wall-clock times, time.time()):
    start-up until the first batch started, and from the end of the last batch to the return."""
    stamped = sorted(
        (_iso(p["timestamp"]), p["durationMs"].get("triggerExecution", 0) / 1000)
        for p in progress
        if p.get("timestamp")
    )
    if not stamped:
        return {}
    first, (last, last_s) = stamped[0][0], stamped[-1]
    between = (last + last_s - first) - sum(d for _, d in stamped)
    return {"startup_s": first - started, "teardown_s": ended - (last + last_s), "between_batches_s": between}


@dataclass
class EosRun:
    wall_s: float
    epochs: list[dict[str, Any]]
    records_out: int
    cpu: dict[str, float]
    fence_s: float
    aborted: list[tuple[int, int, str]] = field(default_factory=list)
    spans: dict[str, float] = field(default_factory=dict)

    @property
    def epoch_time_s(self) -> float:
        return sum(e["trigger_s"] for e in self.epochs)


def run_eos(
    spark,
    config: dict[str, Any],
    base_dir: Path,
    broker_pid: int | None,
    trigger: str = "available-now",
    stop_when=None,
    extra_listeners: list[EpochListener] | None = None,
) -> EosRun:
    """Run one pipeline to its end (available-now), or until `stop_when()` turns true (a
    processing-time trigger; stopped with SIGTERM to this process: eos's graceful stop)."""
    from eos.runner import RunOptions, run_config

    collector = Collector()
    parsed = pipeline_from_yaml(parse_yaml(yaml.safe_dump(config, sort_keys=False), f"<{config['name']}>"))
    meter = CpuMeter(os.getpid(), broker_pid)
    watcher = None
    if stop_when is not None:
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.25):
                # Only once an epoch committed: eos installs its SIGTERM handler when the query starts.
                if collector.reports and stop_when():
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        watcher = threading.Thread(target=watch, name="bench-stop", daemon=True)
    options = RunOptions(
        spark=spark,
        trigger=trigger,
        progress=False,
        install_signal_handlers=stop_when is not None,
        listeners=[collector, *(extra_listeners or [])],
    )
    meter.start()
    started, started_wall = time.monotonic(), time.time()
    if watcher is not None:
        watcher.start()
    try:
        result = run_config(parsed, base_dir, options)
    finally:
        if watcher is not None:
            done.set()
    wall = time.monotonic() - started
    spans = run_spans(list(collector.progress.values()), started_wall, time.time())
    if collector.recovered_at is not None:
        spans["startup_to_recovered_s"] = collector.recovered_at - started_wall
    cpu = meter.stop()
    return EosRun(
        wall_s=wall,
        epochs=collector.epochs(),
        records_out=sum(result.records_out.values()),
        cpu=cpu,
        fence_s=sum(r.duration_s for r in collector.recoveries),
        aborted=collector.aborted,
        spans=spans,
    )

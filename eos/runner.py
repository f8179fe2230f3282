"""`eos run`: one pipeline as one Spark Structured Streaming query, exactly once.

Start-up order matters: lock the checkpoint, check it belongs to this pipeline, resolve (once)
and pin the sources' starting offsets, check topics and slots, build the plan, then recover:
fence every transactional id and read the ledger, before Spark replays anything.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos_connectors.kafka import offsets as planning
from eos_connectors.kafka.clients import (
    BrokerUnreachable,
    UnknownTopic,
    admin_client,
    create_topic,
    describe_partitions,
)
from eos_connectors.kafka.source import SourceError, resolve_starting_offsets

from eos.config import PipelineConfig, load_pipeline, parse_duration
from eos.errors import CheckpointError, ConfigError, EnvironmentProblem, EosError, EpochFailed
from eos.failpoints import from_specs
from eos.pipeline import build, client_config
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.committer import EpochCommitter, EpochListener, user_message
from eos.protocol.coordinator import Coordinator

log = logging.getLogger("eos.runner")

STOP_MARKER = "eos graceful stop"


class StopRequested(RuntimeError):
    """Raised into Spark when a stop was requested as a new epoch began: the epoch stays logged
    but uncommitted, and is replayed on the next start. Returning instead would let Spark mark
    it committed with nothing written."""


@dataclass
class RunOptions:
    master: str | None = None
    trigger: str | None = None  # overrides epochs.trigger, e.g. "available-now"
    failpoints: list[str] = field(default_factory=list)
    listeners: list[EpochListener] = field(default_factory=list)
    progress: bool = True
    metrics_port: int | None = None
    spark: Any = None  # an existing SparkSession (tests); the runner uses a new session of it
    install_signal_handlers: bool = True


@dataclass
class RunResult:
    pipeline: str
    epochs_committed: int = 0
    records_out: dict[str, int] = field(default_factory=dict)
    stopped_by: str = "finished"


class _Tally(EpochListener):
    def __init__(self, result: RunResult):
        self.result = result

    def on_epoch_committed(self, report) -> None:
        self.result.epochs_committed += 1
        for sink, n in report.records_out.items():
            self.result.records_out[sink] = self.result.records_out.get(sink, 0) + n


def _with_retries(what: str, bootstrap: str, call, attempts: int | None = None, wait_s: float | None = None):
    """Bounded retries for reaching a cluster at start-up, then a clear message. Defaults: 3
    attempts 5 s apart (EOS_STARTUP_ATTEMPTS, EOS_STARTUP_RETRY_WAIT_S change them)."""
    attempts = max(1, attempts or int(os.environ.get("EOS_STARTUP_ATTEMPTS", "3")))
    wait_s = wait_s if wait_s is not None else float(os.environ.get("EOS_STARTUP_RETRY_WAIT_S", "5"))
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except BrokerUnreachable as exc:
            if attempt == attempts:
                raise EnvironmentProblem(
                    f"{what}: cannot reach Kafka at {bootstrap} after {attempts} attempts over "
                    f"~{attempts * (10 + wait_s) - wait_s:.0f} s ({exc})",
                    hint="is the broker running (`eos kafka status`) and is bootstrap right?",
                ) from None
            log.warning("%s: Kafka at %s unreachable (attempt %d/%d), retrying", what, bootstrap, attempt, attempts)
            time.sleep(wait_s)


def _check_sink_topics(config: PipelineConfig) -> None:
    for sink in config.sinks:
        admin = admin_client(client_config(sink.kafka))
        try:
            _with_retries(
                f"sink {sink.name}",
                sink.kafka.bootstrap,
                lambda a=admin, s=sink: describe_partitions(a, [s.kafka.topic]),
            )
        except UnknownTopic:
            if not sink.kafka.create_topic:
                raise ConfigError(
                    f"sink {sink.name}: topic {sink.kafka.topic!r} does not exist on {sink.kafka.bootstrap}",
                    hint="create it, or set `create_topic: true` (with `partitions: N`) on the sink",
                ) from None
            create_topic(admin, sink.kafka.topic, sink.kafka.partitions)
    for source in config.sources:
        if source.dlq_topic:
            create_topic(admin_client(client_config(source.kafka)), source.dlq_topic, 1)


def _resolve_sources(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    resolved = {}
    for source in config.sources:
        kafka = source.kafka
        try:
            offsets = _with_retries(
                f"source {source.name}", kafka.bootstrap,
                lambda k=kafka: resolve_starting_offsets(
                    client_config(k), list(k.topics), k.starting_offsets, k.isolation == "read_committed"
                ),
            )  # fmt: skip
        except UnknownTopic as exc:
            raise ConfigError(
                f"source {source.name}: topic {exc.topic!r} does not exist on {kafka.bootstrap}"
            ) from None
        except SourceError as exc:
            raise ConfigError(f"source {source.name}: {exc}") from None
        resolved[source.name] = {"topics": list(kafka.topics), "starting": planning.encode(offsets)}
    return resolved


def prepare_checkpoint(config: PipelineConfig, checkpoint: Checkpoint, parallelism: int) -> tuple[CheckpointMeta, bool]:
    """Read (or create, on first start) the checkpoint's eos metadata and check it against the
    config. Returns (meta, created)."""
    meta = checkpoint.read_meta()
    if meta is None:
        slots = config.epochs.slots or parallelism
        meta = Checkpoint.new_meta(
            config.name, slots, config.epochs.mode, _resolve_sources(config), [s.name for s in config.sinks]
        )
        return meta, True
    checkpoint.check_owner(meta, config.name)
    if config.epochs.slots is not None and config.epochs.slots != meta.slots:
        raise CheckpointError(
            f"the checkpoint {checkpoint.root} was created with {meta.slots} sink slots; the pipeline now asks for "
            f"{config.epochs.slots}. Slot routing is fixed for a checkpoint's life (a replay must send every record "
            "to the slot it went to before).",
            hint=f"change it safely with `eos rescale PIPELINE --slots {config.epochs.slots}` while it is stopped",
        )
    if meta.mode != config.epochs.mode:
        raise CheckpointError(
            f"the checkpoint {checkpoint.root} was written in mode {meta.mode}; the pipeline now says "
            f"{config.epochs.mode}. Use a new checkpoint location to switch modes."
        )
    known, wanted = set(meta.sources), {s.name for s in config.sources}
    if known != wanted:
        raise CheckpointError(
            f"the pipeline's sources changed ({sorted(known)} -> {sorted(wanted)}); Spark cannot resume a "
            "checkpoint whose sources differ. Use a new checkpoint location."
        )
    for source in config.sources:
        if sorted(meta.sources[source.name]["topics"]) != sorted(source.kafka.topics):
            raise CheckpointError(
                f"source {source.name}: topics changed from {meta.sources[source.name]['topics']} to "
                f"{list(source.kafka.topics)}; use a new checkpoint location"
            )
    _check_offset_log(checkpoint)
    return meta, False


def _check_offset_log(checkpoint: Checkpoint) -> None:
    """The epoch Spark will replay must be readable: refuse to start on a damaged offset log
    with a message that says so, instead of failing inside Spark."""
    last = checkpoint.last_logged_epoch()
    if last is None:
        return
    path = checkpoint.root / "offsets" / str(last)
    # Spark's streaming sources (each config source is two: see eos_connectors.formats.split_poison),
    # one JSON line each; logged_offsets raises CheckpointError on a line that does not parse.
    if not checkpoint.logged_offsets(last):
        raise CheckpointError(
            f"Spark's offset log {path} is corrupt: it holds no source offsets; refusing to start (eos never "
            "silently resets). Restore the checkpoint from a backup, or start on a new checkpoint location."
        )


def _coordinator(config: PipelineConfig, spark) -> Coordinator:
    master = spark.sparkContext.master
    host = config.coordinator.host
    if host is None:
        host = "127.0.0.1" if master.startswith("local") else spark.conf.get("spark.driver.host")
    bind = "127.0.0.1" if host == "127.0.0.1" else "0.0.0.0"
    return Coordinator(bind_host=bind, port=config.coordinator.port, advertise_host=host)


def run(path: str | Path, options: RunOptions | None = None) -> RunResult:
    path = Path(path)
    return run_config(load_pipeline(path), path.resolve().parent, options or RunOptions())


def run_config(config: PipelineConfig, base_dir: Path | None, options: RunOptions) -> RunResult:
    from eos_connectors.formats import check_formats

    from eos.observe.metrics import start_telemetry
    from eos.observe.progress import ProgressPrinter, SparkProgressBridge
    from eos.sparksession import build_spark

    check_formats(config, base_dir)  # a missing or invalid schema file fails before Spark or Kafka
    checkpoint = Checkpoint(config.checkpoint_path(base_dir))
    checkpoint.lock()
    coordinator = None
    telemetry = None
    result = RunResult(config.name)
    try:
        failpoints = from_specs(options.failpoints, str(checkpoint.meta_dir / "failpoints"))
        if options.spark is not None:
            spark = options.spark.newSession()
        else:
            master = options.master or config.spark.master
            conf = {k: str(v) for k, v in config.spark.conf.items()}
            spark = build_spark(f"eos-{config.name}", master=master, conf=conf, checkpoint=checkpoint.root.as_posix())
        parallelism = spark.sparkContext.defaultParallelism
        meta, created = prepare_checkpoint(config, checkpoint, parallelism)
        if meta.slots > parallelism:
            raise ConfigError(
                f"{meta.slots} sink slots need {meta.slots} task slots running at once (one barrier stage), but this "
                f"Spark offers {parallelism} (master {spark.sparkContext.master}). Refusing to start instead of "
                "waiting on a barrier stage that cannot be scheduled.",
                hint="give Spark more cores (local[N], more executors) or use fewer slots",
            )
        _check_sink_topics(config)
        built = build(spark, config, meta, base_dir, failpoints)
        if created:
            checkpoint.write_meta(meta)
        exactly_once = config.epochs.mode == "exactly-once"
        coordinator = _coordinator(config, spark) if exactly_once else None
        metrics_port = options.metrics_port if options.metrics_port is not None else config.metrics.port
        telemetry = start_telemetry(
            config, meta.slots, built.targets, checkpoint, meta, coordinator, metrics_port, lag=options.progress
        )
        listeners: list[EpochListener] = [_Tally(result), *telemetry.listeners, *options.listeners]
        printer = None
        if options.progress:
            printer = ProgressPrinter(config.name, sys.stderr, telemetry.tracker, telemetry.lag)
            listeners.append(printer)
        committer = EpochCommitter(
            spark,
            pipeline=config.name,
            checkpoint_id=meta.checkpoint_id,
            slots=meta.slots,
            exactly_once=exactly_once,
            targets=built.targets,
            ledger_topic=config.ledger_topic,
            coordinator=coordinator,
            epoch_timeout_s=config.epochs.timeout,
            tolerable_failures=config.epochs.tolerable_failures,
            min_pause_s=config.epochs.min_pause,
            failpoints=failpoints,
            listeners=listeners,
        )
        pending = _pending_replay(checkpoint)
        committer.recover(pending or ("first start" if created else "start-up"))
        committer.stop_requested = False
        trigger = options.trigger or config.epochs.trigger
        writer = (
            built.stream.writeStream.foreachBatch(_guarded(committer))
            .option("checkpointLocation", checkpoint.root.as_posix())
            .outputMode(config.epochs.output_mode)
            .queryName(f"eos-{config.name}")
        )
        if trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(parse_duration(trigger) * 1000)} milliseconds")
        bridge = SparkProgressBridge(listeners)
        spark.streams.addListener(bridge)
        query = None
        try:
            query = writer.start()
            result.stopped_by = _await(query, committer, config.epochs.timeout, options.install_signal_handlers)
            publish_committed_offsets(config, checkpoint)
        finally:
            if query is not None:
                bridge.catch_up(query)  # the bus is asynchronous: the last batch's progress may lag
            spark.streams.removeListener(bridge)
            if printer is not None:
                printer.flush()
        return result
    finally:
        if telemetry is not None:
            telemetry.close()
        if coordinator is not None:
            coordinator.close()
        checkpoint.unlock()


def publish_committed_offsets(config: PipelineConfig, checkpoint: Checkpoint) -> None:
    """Commit each source's consumer group to the end of the last committed epoch. Spark commits
    sources one epoch late (when the next epoch starts), so without this the group would show an
    epoch of phantom lag after a stop. For monitoring only: recovery never reads these offsets."""
    from confluent_kafka import TopicPartition
    from eos_connectors.kafka.clients import consumer

    last = checkpoint.last_committed_epoch()
    if last is None:
        return
    try:
        logged = [planning.decode(line) for line in checkpoint.logged_offsets(last)]
    except CheckpointError:
        return
    for source in config.sources:
        topics = set(source.kafka.topics)
        # A source may be planned as several Spark sources (branches); all of them have read at
        # least the smallest end they logged.
        ends: dict[tuple[str, int], int] = {}
        for offsets in logged:
            if offsets and {t for t, _ in offsets} <= topics:
                for tp, offset in offsets.items():
                    ends[tp] = min(offset, ends.get(tp, offset))
        if not ends:
            continue
        group = consumer(client_config(source.kafka), **{"group.id": f"{config.consumer_group}.{source.name}"})
        try:
            group.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False)
        except Exception as exc:  # monitoring only
            log.warning("source %s: could not publish committed offsets: %s", source.name, exc)
        finally:
            group.close()


def _pending_replay(checkpoint: Checkpoint) -> str | None:
    epoch = checkpoint.pending_replay()
    if epoch is not None:
        return f"epoch {epoch} was logged but not marked committed: Spark replays it with the same offsets"
    return None


def _guarded(committer: EpochCommitter):
    """foreachBatch function: remembers our own exception (Spark re-wraps it) and honours stops."""

    def run_epoch(df, epoch: int) -> None:
        if committer.stop_requested:
            raise StopRequested(STOP_MARKER)
        try:
            committer(df, epoch)
        except EosError as exc:
            committer.fatal_error = exc
            raise

    return run_epoch


def _await(query, committer: EpochCommitter, epoch_timeout_s: float, handle_signals: bool) -> str:
    stop_signal: list[int] = []
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if stop_signal:  # a second signal: stop now, the current epoch is aborted
            print("eos: stopping now; the current epoch is aborted and will be replayed", file=sys.stderr)
            threading.Thread(target=query.stop, daemon=True).start()
        stop_signal.append(signum)

    if handle_signals and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        stopping = False
        while True:
            try:
                if query.awaitTermination(0.5):
                    break
            except Exception as exc:
                fatal = getattr(committer, "fatal_error", None)
                if stopping and STOP_MARKER in str(exc):
                    break
                if fatal is not None:
                    raise fatal from None
                message = user_message(exc)
                if message:
                    raise EpochFailed(message) from None
                raise EpochFailed(f"the streaming query failed: {str(exc).splitlines()[0][:500]}") from exc
            if stop_signal and not stopping:
                stopping = True
                name = signal.Signals(stop_signal[0]).name
                print(f"eos: {name}: finishing the current epoch, then stopping", file=sys.stderr, flush=True)
                committer.stop_requested = True
                if committer.busy.acquire(timeout=epoch_timeout_s + 30):
                    committer.busy.release()
                try:
                    query.stop()
                except Exception as exc:  # the JVM got the signal too (a process-group kill) and stopped
                    print(
                        f"eos: Spark stopped on its own ({str(exc).splitlines()[0][:120]}); any epoch in "
                        "flight is aborted and will be replayed on the next start",
                        file=sys.stderr,
                        flush=True,
                    )
                    break
        return signal.Signals(stop_signal[0]).name if stop_signal else "finished"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def describe_plan(config: PipelineConfig) -> Iterable[str]:
    """Lines for `eos validate`: what the pipeline reads, does and writes (no secrets)."""
    epochs = config.epochs
    yield f"pipeline {config.name}: mode {epochs.mode}, trigger {epochs.trigger}, checkpoint {config.checkpoint}"
    for source in config.sources:
        yield (
            f"  source {source.name}: {', '.join(source.kafka.topics)} @ {source.kafka.bootstrap} "
            f"({source.value_format.type}, {source.kafka.isolation}, start {source.kafka.starting_offsets if isinstance(source.kafka.starting_offsets, str) else 'explicit'}, on_error {source.on_error})"  # noqa: E501
        )
    for transform in config.transforms:
        yield f"  transform {transform.name}: {'sql' if transform.sql else 'python ' + str(transform.python)}"
    for sink in config.sinks:
        yield (
            f"  sink {sink.name}: {config.sink_input(sink)} -> {sink.kafka.topic} @ {sink.kafka.bootstrap} "
            f"({sink.value_format.type}), transactional ids {sink.transactional_id_prefix or config.name}-{sink.name}-<slot>"  # noqa: E501
        )
    slots = epochs.slots or "Spark's default parallelism, fixed at first start"
    yield f"  ledger topic {config.ledger_topic}; sink slots: {slots}"

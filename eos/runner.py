"""`eos run`: one pipeline as one Spark Structured Streaming query, exactly once.

Start-up order matters:
  1. read the checkpoint's metadata (or create it), check it belongs to this pipeline, that every
     source still reads what it pinned, and that nothing that decides a replay changed while an
     epoch is pending;
  2. check every source and sink (topics exist, settings the protocol needs), build the plan;
  3. take the pipeline over in the control log: ask the previous driver whether it still runs
     (refuse unless --take-over), then fence it;
  4. recover (eos.protocol.recovery): fence, resolve, read the ledgers; only then start Spark,
     which replays the pending epoch, if any, with its logged offsets.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos.config import PipelineConfig, load_pipeline, parse_duration
from eos.errors import CheckpointError, ConfigError, EosError, EpochFailed, from_spark
from eos.failpoints import SOURCE_POINTS, from_specs
from eos.pipeline import Connectors, build, connectors, pipeline_info, replay_config
from eos.protocol.channel import Liveness, ping
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.committer import EpochCommitter
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState, DriverInfo
from eos.protocol.plan import digest
from eos.protocol.report import EpochListener
from eos.protocol.source import StreamOptions

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
    metrics_host: str | None = None  # overrides metrics.host (default 127.0.0.1)
    spark: Any = None  # an existing SparkSession (tests); the runner uses a new session of it
    install_signal_handlers: bool = True
    take_over: bool = False  # fence a driver that still answers, instead of refusing to start
    finish_pending: bool = False  # replay the pending epoch, then stop


@dataclass
class RunResult:
    pipeline: str
    epochs_committed: int = 0
    records_out: dict[str, int] = field(default_factory=dict)
    stopped_by: str = "finished"


class _Tally(EpochListener):
    def __init__(self, result: RunResult):
        self.result = result

    def on_epoch_committed(self, report: Any) -> None:
        self.result.epochs_committed += 1
        for sink, n in report.records_out.items():
            self.result.records_out[sink] = self.result.records_out.get(sink, 0) + n


# ---------------------------------------------------------------------------------------------
# 1. The checkpoint's metadata
# ---------------------------------------------------------------------------------------------


@dataclass
class StartState:
    meta: CheckpointMeta
    found: Connectors
    created: bool
    pending: int | None
    changes: list[str]  # how the replay config differs from the pending epoch's (empty: it does not)


def prepare_checkpoint(config: PipelineConfig, checkpoint: Checkpoint, found_for: Any, parallelism: int) -> StartState:
    """Read (or create) the checkpoint's eos metadata and check the config against it.
    `found_for(checkpoint_id)` builds the connectors."""
    meta = checkpoint.read_meta()
    if meta is None:
        found = found_for(Checkpoint.new_id())
        pins = {source.name: source.pin() for source in found.sources}
        replay = replay_config(config, found, parallelism)
        meta = CheckpointMeta(
            config.name, found.sources[0].pipeline.checkpoint_id, config.epochs.mode, pins, replay, digest(replay)
        )
        return StartState(meta, found, True, None, [])
    checkpoint.check_owner(meta, config.name)
    if meta.mode != config.epochs.mode:
        raise CheckpointError(
            f"the checkpoint {checkpoint.uri} was written in mode {meta.mode}; the pipeline now says "
            f"{config.epochs.mode}. Use a new checkpoint location to switch modes."
        )
    found = found_for(meta.checkpoint_id)
    known, wanted = set(meta.sources), {s.name for s in found.sources}
    if known != wanted:
        raise CheckpointError(
            f"the pipeline's sources changed ({sorted(known)} -> {sorted(wanted)}); Spark cannot resume a "
            "checkpoint whose sources differ. Use a new checkpoint location."
        )
    for source in found.sources:
        source.check_pin(meta.sources[source.name])
    _check_offset_log(checkpoint)
    pending = checkpoint.pending_replay()
    if pending is not None and config.epochs.slots is None:
        parallelism = int(meta.replay.get("parallelism", parallelism))  # the pending epoch's own
    replay = replay_config(config, found, parallelism)
    changes = []
    if pending is not None and digest(replay) != meta.replay_digest:
        changes = describe_changes(meta.replay, replay) or ["(the replay config's digest differs)"]
    meta.replay, meta.replay_digest = replay, digest(replay)
    return StartState(meta, found, False, pending, changes)


def check_changes_while_pending(prepared: StartState, state: ControlState) -> None:
    """A changed config is refused while the pending epoch may have committed anywhere: a replay
    under the new config would route or encode its records differently from what is committed
    (loss plus duplicates). Slots commit only after the epoch's decision is recorded, so without a
    decision for the pending epoch nothing of it is committed, and the new config is safe (the
    common case: an epoch that failed on a poison record, replayed with `on_error: dlq`)."""
    decided = state.decision is not None and state.decision.epoch == prepared.pending
    if prepared.changes and decided:
        raise CheckpointError(
            f"epoch {prepared.pending} is pending and was already partly committed, and must be replayed with the "
            f"config it was planned with, but the pipeline changed: {'; '.join(prepared.changes)}. Replaying it "
            "under the new config would route or encode its records differently (loss plus duplicates).",
            hint="restore the previous pipeline file, run `eos run FILE --finish-pending` (it replays the pending "
            "epoch and stops), then start with the new file",
        )


def describe_changes(before: Any, after: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            out += describe_changes(before.get(key), after.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for index, (a, b) in enumerate(zip(before, after, strict=True)):
            name = a.get("name") if isinstance(a, dict) and a.get("name") == (b or {}).get("name") else index
            out += describe_changes(a, b, f"{path}[{name}]")
        return out
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def _check_offset_log(checkpoint: Checkpoint) -> None:
    """The epoch Spark will replay must be readable: refuse to start on a damaged offset log with
    a message that says so, instead of failing inside Spark."""
    last = checkpoint.last_logged_epoch()
    if last is None:
        return
    if not checkpoint.logged_offsets(last):
        raise CheckpointError(
            f"Spark's offset log {checkpoint.uri}/offsets/{last} is corrupt: it holds no source offsets; refusing "
            "to start (eos never silently resets). Restore the checkpoint from a backup, or start on a new "
            "checkpoint location."
        )


# ---------------------------------------------------------------------------------------------
# 3. One driver
# ---------------------------------------------------------------------------------------------


def take_over(control: ControlLog, driver: DriverInfo, allow: bool) -> ControlState:
    """Refuse to start while another driver of this pipeline answers (unless told to fence it);
    then fence every earlier driver. Fencing is what keeps two drivers from both committing;
    asking first turns an accidental second start into a clear error instead of a takeover."""
    previous = control.previous_driver()
    if previous is not None and previous.run != driver.run and not allow:
        # Only the recorded driver can prove it answers (its ping key, pipeline and run): another
        # pipeline's vote service on a reused port, or any other process there, does not count.
        answer = ping(previous)
        if answer is Liveness.ALIVE:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(previous.started_at))
            raise CheckpointError(
                f"another eos driver is running this pipeline: pid {previous.pid} on {previous.host} (vote service "
                f"{previous.address}, started {started}). Two drivers must never run one pipeline.",
                hint="stop it first; or, if it is a stale process you cannot reach, start with --take-over (the "
                "old driver is fenced: it can no longer commit and stops at its next epoch)",
            )
        if answer is Liveness.OTHER:
            earlier = "" if previous.ping_key else " (or it is a driver of an earlier eos, which cannot prove it)"
            print(
                f"eos: the last driver's vote service address {previous.address} answers, but not as that driver (pid "
                f"{previous.pid} on {previous.host}, run {previous.run}): another process holds the port now, such as "
                f"another pipeline's vote service{earlier}; taking the pipeline over",
                file=sys.stderr,
                flush=True,
            )
    return control.take_over(driver)


def _coordinator(config: PipelineConfig, spark: Any, identity: dict[str, Any], slots: int = 0) -> Coordinator:
    """The vote service listens only where the executors reach it: `coordinator.host`, else the
    driver's host (127.0.0.1 for a local master, else spark.driver.host). Like Spark's own driver,
    it binds to spark.driver.bindAddress instead when that is set (a driver behind NAT or in a
    container, whose advertised name is not an address of its own)."""
    local = spark.sparkContext.master.startswith("local")
    host = config.coordinator.host
    if host is None:
        host = "127.0.0.1" if local else spark.conf.get("spark.driver.host")
    bind = host if local else (spark.conf.get("spark.driver.bindAddress", None) or host)
    port = config.coordinator.port
    try:
        return Coordinator(bind_host=bind, port=port, advertise_host=host, identity=identity, slots=slots)
    except OSError as exc:
        raise ConfigError(
            f"the vote service cannot listen on {bind}:{port}: {exc}",
            hint="set coordinator.host to an address of this machine that the executors reach (or "
            "spark.driver.bindAddress, if the driver's advertised host is not one), and coordinator.port to a free "
            "port or 0",
        ) from None


def check_spark(spark: Any) -> None:
    """Spark settings the protocol cannot work with, refused up front with the reason."""
    # One setting, one call: sparkContext.getConf() copies every setting over Py4J (20-40 ms).
    if spark.conf.get("spark.python.worker.reuse", "true").lower() == "false":
        raise ConfigError(
            "spark.python.worker.reuse is false: eos keeps each transactional producer in the Python worker that "
            "pre-committed with it until the epoch's commit decision; without worker reuse the worker exits first "
            "and every epoch is replayed",
            hint="remove spark.python.worker.reuse=false from the Spark config",
        )


# ---------------------------------------------------------------------------------------------
# eos run
# ---------------------------------------------------------------------------------------------


def run(path: str | Path, options: RunOptions | None = None) -> RunResult:
    path = Path(path)
    return run_config(load_pipeline(path), path.resolve().parent, options or RunOptions())


def run_config(config: PipelineConfig, base_dir: Path | None, options: RunOptions) -> RunResult:
    from eos.observe.metrics import start_telemetry
    from eos.observe.progress import ProgressPrinter, SparkProgressBridge
    from eos.sparksession import build_spark

    location = config.checkpoint_path(base_dir)
    result = RunResult(config.name)
    coordinator: Coordinator | None = None
    control: ControlLog | None = None
    telemetry = None
    found: Connectors | None = None
    try:
        if options.spark is not None:
            spark = options.spark.newSession()
        else:
            conf = {k: str(v) for k, v in config.spark.conf.items()}
            spark = build_spark(
                f"eos-{config.name}", master=options.master or config.spark.master, conf=conf, checkpoint=location
            )
        check_spark(spark)
        checkpoint = Checkpoint(location, spark)
        failpoints = from_specs(options.failpoints, str(checkpoint.scratch_dir() / "failpoints"))
        parallelism = config.epochs.slots or spark.sparkContext.defaultParallelism

        def found_for(checkpoint_id: str) -> Connectors:
            return connectors(config, pipeline_info(config, checkpoint_id, base_dir))

        prepared = prepare_checkpoint(config, checkpoint, found_for, parallelism)
        meta, found, created = prepared.meta, prepared.found, prepared.created
        for connector in [*found.sources, *found.sinks]:
            connector.validate()
        for connector in [*found.sources, *found.sinks]:
            connector.check(spark)
        if "spark.sql.shuffle.partitions" not in config.spark.conf:
            # Slots are the partitions of the epoch's rows: a stateless pipeline's come from the
            # source's read tasks, a stateful one's from its shuffle; `slots` means both.
            # (Spark keeps a stateful checkpoint's own number once it has one.)
            spark.conf.set("spark.sql.shuffle.partitions", str(meta.replay["parallelism"]))
        run_id = uuid.uuid4().hex[:12]
        options_ = StreamOptions(
            parallelism=int(meta.replay["parallelism"]),
            failpoints=[p.spec() for p in failpoints.points if p.name in SOURCE_POINTS],
            failpoint_state=failpoints.state_dir,
            driver_pgid=failpoints.driver_pgid,
            barriers=str(checkpoint.scratch_dir() / "barriers"),
            run=run_id,
        )
        pending = prepared.pending
        state = ControlState()
        driver: DriverInfo | None = None
        if config.exactly_once:
            # A sink's slots are its branch's partitions: the source's read tasks, or a shuffle's.
            partitions = max(int(meta.replay["parallelism"]), int(spark.conf.get("spark.sql.shuffle.partitions")))
            slots = partitions * len(found.sinks)
            coordinator = _coordinator(config, spark, {"pipeline": config.name, "run": run_id}, slots)
            control = found.sources[0].control_log()
            driver = DriverInfo(
                run_id, socket.gethostname(), os.getpid(), coordinator.address.hostport, pipeline=config.name,
                ping_key=coordinator.ping_key,
            )  # fmt: skip
        # The take-over waits on Kafka and the build on Spark's JVM: at every start they overlap
        # (the take-over is ~0.1 s; on two busy cores the start gains less, 0.035 s median in
        # bench/NOTES.md). A take-over that only fences drivers which no longer answer is safe before
        # the build has checked the transforms; one told to fence a live driver (--take-over)
        # still waits for a build that succeeded, and --finish-pending with nothing pending
        # fences nothing. The sinks' slow set-up (a new pipeline's ledger topic) runs beside both.
        overlap = control is not None and driver is not None and not options.take_over and not options.finish_pending
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="eos-beside-build") as pool:
            setting_up = [pool.submit(sink.set_up) for sink in found.sinks]
            taking = pool.submit(take_over, control, driver, False) if overlap else None
            built = build(spark, config, found, meta.sources, options_)
        # Leaving the pool waited for both, also when the build failed (the build's error is raised).
        for done in setting_up:
            done.result()  # a sink's error, such as a ledger topic that is not compacted
        if options.finish_pending and pending is None:
            print(f"eos: {config.name}: no epoch is pending; nothing to finish", file=sys.stderr, flush=True)
            return result
        if taking is not None:
            state = taking.result()
        elif control is not None and driver is not None:
            state = take_over(control, driver, options.take_over)
        check_changes_while_pending(prepared, state)
        checkpoint.write_meta(meta)  # after the checks: a refused config is never recorded
        metrics_port = options.metrics_port if options.metrics_port is not None else config.metrics.port
        telemetry = start_telemetry(
            config, found, checkpoint, coordinator, metrics_port, lag=options.progress, host=options.metrics_host
        )
        listeners: list[EpochListener] = [_Tally(result), *telemetry.listeners, *options.listeners]
        printer = None
        if options.progress:
            printer = ProgressPrinter(config.name, sys.stderr, telemetry.tracker, telemetry.lag)
            listeners.append(printer)
        committer = EpochCommitter(
            spark,
            pipeline=found.sinks[0].pipeline,
            sinks=found.sinks,
            plans=built.plans,
            checkpoint=checkpoint,
            config_digest=meta.replay_digest,
            control=control,
            coordinator=coordinator,
            pools=state.pools,
            tolerable_failures=config.epochs.tolerable_failures,
            taken_over=state if control is not None else None,
            min_pause_s=config.epochs.min_pause,
            failpoints=failpoints,
            listeners=listeners,
            run=run_id,
            meta=meta,  # records the sources' poison decisions (eos.protocol.poison)
        )
        if coordinator is not None:
            coordinator.on_grow = committer.grow
        committer.recover(_reason(pending, created))
        trigger = options.trigger or config.epochs.trigger
        writer = (
            built.stream.writeStream.foreachBatch(_guarded(committer))
            .option("checkpointLocation", checkpoint.uri)
            .outputMode(config.epochs.output_mode)
            .queryName(f"eos-{config.name}")
        )
        if options.finish_pending:
            # Once, on a checkpoint with a pending epoch, runs exactly that epoch again and stops:
            # no new epoch is planned (and left pending) under the config being retired.
            writer = writer.trigger(once=True)
        elif trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(parse_duration(trigger) * 1000)} milliseconds")
        bridge = SparkProgressBridge(listeners)
        spark.streams.addListener(bridge)
        query = None
        publishing: threading.Thread | None = None
        try:
            query = writer.start()
            result.stopped_by = _await(query, committer, config.epochs.timeout, options.install_signal_handlers)
            # Both only wait on I/O (a group commit; the listener bus): one overlaps the other.
            publishing = threading.Thread(target=publish_progress, args=(found, checkpoint), name="eos-publish")
            publishing.start()
        finally:
            if query is not None:
                bridge.catch_up(query)  # the bus is asynchronous: the last batch's progress may lag
            if publishing is not None:
                publishing.join()
            spark.streams.removeListener(bridge)
            if printer is not None:
                printer.flush()
        return result
    finally:
        if telemetry is not None:
            telemetry.close()
        if coordinator is not None:
            coordinator.close()
        if control is not None:
            control.close()
        if found is not None:
            for connector in [*found.sources, *found.sinks]:
                connector.close()


def _reason(pending: int | None, created: bool) -> str:
    if pending is not None:
        return f"epoch {pending} was logged but not marked committed: Spark replays it with the same offsets"
    return "first start" if created else "start-up"


def publish_progress(found: Connectors, checkpoint: Checkpoint) -> None:
    """Let each source publish the end of the last committed epoch (Spark tells sources one epoch
    late, so without this external monitors would show an epoch of phantom lag after a stop).
    Monitoring only: recovery never reads it, and it never fails the run (it runs on a thread of
    its own while the run stops)."""
    try:
        last = checkpoint.last_committed_epoch()
        if last is None:
            return
        logged = checkpoint.logged_offsets(last)
    except CheckpointError:
        return
    except Exception as exc:
        log.warning("could not read the last committed epoch's offsets to publish them: %s", exc)
        return
    from eos.observe.lag import line_of

    for source in found.sources:
        offsets = line_of(source, logged)
        if offsets is None:
            continue
        try:
            source.publish_progress(offsets)
        except Exception as exc:  # monitoring only
            log.warning("source %s: could not publish its progress: %s", source.name, exc)


def _guarded(committer: EpochCommitter):
    """foreachBatch function: remembers our own exception (Spark re-wraps it) and honours stops."""

    def run_epoch(df: Any, epoch: int) -> None:
        if committer.stop_requested:
            raise StopRequested(STOP_MARKER)
        try:
            committer(df, epoch)
        except EosError as exc:
            committer.fatal_error = exc
            raise

    return run_epoch


def _await(query: Any, committer: EpochCommitter, epoch_timeout_s: float, handle_signals: bool) -> str:
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
                if (stopping or committer.stop_requested) and STOP_MARKER in str(exc):
                    break
                if committer.fatal_error is not None:
                    raise committer.fatal_error from None
                typed = from_spark(exc)
                if typed is not None:
                    raise EpochFailed(typed.message, typed.hint) from None
                raise EpochFailed(f"the streaming query failed: {str(exc).splitlines()[0][:500]}") from exc
            if stop_signal and not stopping:
                stopping = True
                name = signal.Signals(stop_signal[0]).name
                print(f"eos: {name}: finishing the current epoch, then stopping", file=sys.stderr, flush=True)
                committer.stop_requested = True
                if not _stop(query, committer, epoch_timeout_s):
                    break
        if stop_signal:
            return signal.Signals(stop_signal[0]).name
        return "finished"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop(query: Any, committer: EpochCommitter, epoch_timeout_s: float) -> bool:
    if committer.busy.acquire(timeout=epoch_timeout_s + 30):
        committer.busy.release()
    try:
        query.stop()
    except Exception as exc:  # the JVM got the signal too (a process-group kill) and stopped
        print(
            f"eos: Spark stopped on its own ({str(exc).splitlines()[0][:120]}); any epoch in flight is aborted and "
            "will be replayed on the next start",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


def describe_plan(config: PipelineConfig, base_dir: Path | None = None) -> Iterable[str]:
    """Lines for `eos validate`: what the pipeline reads, does and writes (no secrets)."""
    found = connectors(config, pipeline_info(config, "(not created yet)", base_dir))
    epochs = config.epochs
    yield f"pipeline {config.name}: mode {epochs.mode}, trigger {epochs.trigger}, checkpoint {config.checkpoint}"
    for source in found.sources:
        yield f"  source {source.name} ({type(source).kind}): {source.describe()}"
    for transform in config.transforms:
        yield f"  transform {transform.name}: {'sql' if transform.sql else 'python ' + str(transform.python)}"
    for sink in found.sinks:
        entry = next((e for e in config.sinks if e.name == sink.name), None)
        origin = config.sink_input(entry) if entry is not None else "poison records"
        yield f"  sink {sink.name} ({type(sink).kind}, {type(sink).recovery.value}): {origin} -> {sink.describe()}"
    slots = epochs.slots or "Spark's default parallelism, fixed at first start"
    yield f"  ledger {config.ledger_topic}; tasks (sink slots) per epoch: {slots}"

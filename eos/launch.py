"""Starting a declared pipeline: from `Pipeline.start()` to a running streaming query.

In this order (nothing of the protocol starts before every check passed):
  1. the checkpoint's metadata for this start (eos.startup.settle): new, or the old one with the
     replay config compared with the pending epoch's;
  2. the query's plan (the union of every sink's rows) and Spark's check of the output mode;
  3. take the pipeline over in the control log: ask the previous driver whether it still runs
     (refuse unless take_over), then fence it; beside it, the sinks' slow set-up (a new
     pipeline's ledger topic);
  4. refuse a changed config if the pending epoch may have committed anywhere; only then write
     the checkpoint's metadata (a refused config is never recorded);
  5. recover (eos.protocol.recovery: fence, resolve, read the ledgers);
  6. start Spark's query, which replays the pending epoch, if any, with its logged offsets.
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eos.analysis import check_output_mode
from eos.config import parse_duration
from eos.declared import Connectors, replay_config
from eos.driver import coordinator_for, take_over
from eos.errors import CheckpointError, EosError
from eos.protocol.committer import EpochCommitter
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState
from eos.protocol.report import EpochListener
from eos.query import EosQuery, RunResult, Tally, guarded
from eos.startup import check_changes_while_pending, settle

log = logging.getLogger("eos.launch")


@dataclass
class StartOptions:
    trigger: str | None = None  # overrides epochs.trigger: an interval, "available-now" or "once"
    take_over: bool = False  # fence a driver that still answers, instead of refusing to start
    finish_pending: bool = False  # replay the pending epoch, then stop
    progress: bool = False  # progress lines on stderr
    metrics_port: int | None = None
    metrics_host: str | None = None  # overrides metrics.host (default 127.0.0.1)
    listeners: list[EpochListener] = field(default_factory=list)
    stop: threading.Event | None = None  # a standby: set to stop standing by (eos.standby)


def launch(pipeline: Any, options: StartOptions) -> EosQuery:
    """`pipeline`: an eos.pipeline.Pipeline whose sources and sinks are declared (it calls this)."""
    from eos.observe.metrics import start_telemetry
    from eos.observe.progress import ProgressPrinter, SparkProgressBridge

    header, spark, checkpoint = pipeline.header, pipeline.spark, pipeline.checkpoint
    config = pipeline.config()
    found = pipeline.connectors()
    result = RunResult(header.name)
    replay = replay_config(config, found, pipeline.parallelism, pipeline.inputs)
    prepared = settle(pipeline.opened, header.name, header.epochs.mode, pipeline.pins, replay)
    meta, pending = prepared.meta, prepared.pending
    coordinator: Coordinator | None = None
    control: ControlLog | None = None
    telemetry = None
    try:
        state = ControlState()
        driver = None
        if header.exactly_once:
            # A sink's slots are its branch's partitions: the source's read tasks, or a shuffle's.
            partitions = max(pipeline.parallelism, int(spark.conf.get("spark.sql.shuffle.partitions")))
            identity = {"pipeline": header.name, "run": pipeline.run_id}
            coordinator = coordinator_for(config, spark, identity, partitions * len(found.sinks))
            control = found.sources[0].control_log()
            driver = pipeline.driver_identity(coordinator)
        # The query's plan first, with Spark's own check of the output mode against it: a plan that
        # cannot run must not have fenced the previous driver or made a ledger topic (nothing of a
        # refused start is left behind).
        stream, plans = pipeline.union()
        try:
            check_output_mode(spark, stream, header.epochs.output_mode)
        except EosError as exc:
            where = config.where(("epochs", "output_mode")) or config.where(("epochs",)) or config.where(())
            raise exc if where is None else type(exc)(f"{where}: {exc.message}", exc.hint) from None
        # The take-over waits on Kafka, and so does the sinks' slow set-up (a new pipeline's ledger
        # topic): they overlap. One told to fence a live driver (take_over) runs after every other
        # check, and finish_pending with nothing pending fences nothing.
        overlap = control is not None and driver is not None and not options.take_over and not options.finish_pending
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="eos-beside-build") as pool:
            setting_up = [pool.submit(sink.set_up) for sink in found.sinks]
            taking = pool.submit(take_over, control, driver, False) if overlap else None
        # Leaving the pool waited for both.
        for done in setting_up:
            done.result()  # a sink's error, such as a ledger topic that is not compacted
        if options.finish_pending and pending is None:
            print(f"eos: {header.name}: no epoch is pending; nothing to finish", file=sys.stderr, flush=True)
            _release(coordinator, control, found, telemetry)
            return EosQuery(None, None, result, header.epochs.timeout, lambda _: None)
        if taking is not None:
            state = taking.result()
        elif control is not None and driver is not None:
            state = take_over(control, driver, options.take_over)
        check_changes_while_pending(prepared, state)
        checkpoint.write_meta(meta)  # after the checks: a refused config is never recorded
        metrics_port = options.metrics_port if options.metrics_port is not None else header.metrics.port
        telemetry = start_telemetry(
            config, found, checkpoint, coordinator, metrics_port, lag=options.progress, host=options.metrics_host
        )
        listeners: list[EpochListener] = [Tally(result), *telemetry.listeners, *options.listeners]
        printer = None
        if options.progress:
            printer = ProgressPrinter(header.name, sys.stderr, telemetry.tracker, telemetry.lag)
            listeners.append(printer)
        committer = EpochCommitter(
            spark,
            pipeline=pipeline.info,
            sinks=found.sinks,
            plans=plans,
            checkpoint=checkpoint,
            config_digest=meta.replay_digest,
            control=control,
            coordinator=coordinator,
            pools=state.pools,
            tolerable_failures=header.epochs.tolerable_failures,
            taken_over=state if control is not None else None,
            min_pause_s=header.epochs.min_pause,
            failpoints=pipeline.failpoints,
            listeners=listeners,
            run=pipeline.run_id,
            meta=meta,
        )
        if coordinator is not None:
            coordinator.on_grow = committer.grow
        committer.recover(_reason(pending, prepared.created))
        writer = (
            stream.writeStream.foreachBatch(guarded(committer))
            .option("checkpointLocation", checkpoint.uri)
            .outputMode(header.epochs.output_mode)
            .queryName(f"eos-{header.name}")
        )
        trigger = options.trigger or header.epochs.trigger
        if options.finish_pending or trigger == "once":
            # Once, on a checkpoint with a pending epoch, runs exactly that epoch again and stops:
            # no new epoch is planned (and left pending) under the config being retired.
            writer = writer.trigger(once=True)
        elif trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(parse_duration(trigger) * 1000)} milliseconds")
        bridge = SparkProgressBridge(listeners)
        spark.streams.addListener(bridge)
        try:
            query = writer.start()
        except BaseException:
            spark.streams.removeListener(bridge)
            raise

        def on_end(query: Any) -> None:
            # Both only wait on I/O (a group commit; the listener bus): one overlaps the other.
            publishing = threading.Thread(target=publish_progress, args=(found, checkpoint), name="eos-publish")
            publishing.start()
            try:
                bridge.catch_up(query)  # the bus is asynchronous: the last batch's progress may lag
            finally:
                publishing.join()
                spark.streams.removeListener(bridge)
                if printer is not None:
                    printer.flush()
                _release(coordinator, control, found, telemetry)

        handle = EosQuery(query, committer, result, header.epochs.timeout, on_end)
        pipeline._state = "started"
        return handle
    except BaseException:
        _release(coordinator, control, found, telemetry)
        raise


def _release(coordinator: Any, control: Any, found: Connectors, telemetry: Any) -> None:
    if telemetry is not None:
        telemetry.close()
    if coordinator is not None:
        coordinator.close()
    if control is not None:
        control.close()
    for connector in [*found.sources, *found.sinks]:
        connector.close()


def _reason(pending: int | None, created: bool) -> str:
    if pending is not None:
        return f"epoch {pending} was logged but not marked committed: Spark replays it with the same offsets"
    return "first start" if created else "start-up"


def publish_progress(found: Connectors, checkpoint: Any) -> None:
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

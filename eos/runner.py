"""`eos run`: a pipeline file run as one Spark Structured Streaming query, exactly once.

The file is a front end to `eos.Pipeline` (eos.yamlpipeline); this module adds what a command
needs around it: the SparkSession built from the file, the progress lines, and the signals
(SIGTERM/SIGINT finish the current epoch, then stop; a second one aborts it). The start-up
sequence itself is eos.launch's.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos.config import PipelineConfig, load_pipeline
from eos.declared import connectors, pipeline_info
from eos.driver import take_over
from eos.protocol.report import EpochListener
from eos.query import STOP_MARKER, EosQuery, RunResult, StopRequested
from eos.startup import check_changes_while_pending, describe_changes

__all__ = [
    "STOP_MARKER",
    "RunOptions",
    "RunResult",
    "StopRequested",
    "check_changes_while_pending",
    "describe_changes",
    "run",
    "run_config",
    "take_over",
]


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
    standby: bool = False  # stand by until the running driver is gone, then take over (eos.standby)


# ---------------------------------------------------------------------------------------------
# eos run
# ---------------------------------------------------------------------------------------------


def run(path: str | Path, options: RunOptions | None = None) -> RunResult:
    path = Path(path)
    return run_config(load_pipeline(path), path.resolve().parent, options or RunOptions())


def run_config(config: PipelineConfig, base_dir: Path | None, options: RunOptions) -> RunResult:
    from eos.yamlpipeline import build_pipeline

    if options.master is not None:
        config = config.model_copy(update={"spark": config.spark.model_copy(update={"master": options.master})})
    if options.standby:  # before Spark starts: what a standby cannot be asked for
        from eos.standby import refuse

        refuse(config.exactly_once, options.take_over, options.finish_pending)
    spark = options.spark
    prechecked = spark is None
    if spark is None:
        # What can be checked without Spark is checked before it starts (tens of seconds on a cold
        # machine): a wrong topic or DSN is reported in seconds.
        from eos.preflight import run_checks
        from eos.sparksession import build_spark

        run_checks(config, base_dir, stop_at_first=True)
        started = time.monotonic()
        master = config.spark.master or "local[*]"
        if options.progress:
            print(f"eos: {config.name}: starting Spark ({master})...", file=sys.stderr, flush=True)
        conf = {k: str(v) for k, v in config.spark.conf.items()}
        spark = build_spark(
            f"eos-{config.name}", master=config.spark.master, conf=conf, checkpoint=config.checkpoint_path(base_dir)
        )
        if options.progress:
            print(
                f"eos: {config.name}: Spark started in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True
            )
    if options.standby:
        from eos.standby import run_standby

        return run_standby(config, base_dir, spark, options, prechecked)
    pipeline = build_pipeline(config, base_dir, spark, options.failpoints, prechecked=prechecked)
    query = pipeline.start(
        options.trigger,
        take_over=options.take_over,
        finish_pending=options.finish_pending,
        progress=options.progress,
        metrics_port=options.metrics_port,
        metrics_host=options.metrics_host,
        listeners=options.listeners,
    )
    query.result.stopped_by = wait(query, options.install_signal_handlers)
    return query.result


def wait(query: EosQuery, handle_signals: bool) -> str:
    """Wait for the query to end; SIGTERM/SIGINT stop it gracefully (a second one aborts the epoch in
    flight). Returns what stopped it: "finished" or the signal's name."""
    stop_signal: list[int] = []
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if stop_signal:  # a second signal: stop now, the current epoch is aborted
            print("eos: stopping now; the current epoch is aborted and will be replayed", file=sys.stderr)
            query.abort()
        stop_signal.append(signum)

    if handle_signals and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        stopping = False
        while not query.awaitTermination(0.5):
            if stop_signal and not stopping:
                stopping = True
                name = signal.Signals(stop_signal[0]).name
                print(f"eos: {name}: finishing the current epoch, then stopping", file=sys.stderr, flush=True)
                query.stop()
        return signal.Signals(stop_signal[0]).name if stop_signal else "finished"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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

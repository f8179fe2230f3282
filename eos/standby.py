"""A hot standby (`eos run PIPELINE --standby`, `Pipeline.start(standby=True)`): a second driver
with Spark up and the pipeline built, which watches the driver the control log records and takes
the pipeline over when that driver is gone.

Standing by, it writes nothing in the pipeline's systems and holds no transactional id: it reads
the control log (the recorded driver: when it begins watching, and again before it takes over) and
the checkpoint's metadata, and pings the recorded driver's vote service (eos.protocol.channel.ping:
a challenge only that driver can answer) every PING_INTERVAL_S. The driver is gone after MISSES
failed pings in a row, each given PING_TIMEOUT_S, the next sent RETRY_S after a failure: a killed
driver's port refuses at once (gone ~0.2 s after the first refusal); a stalled one (SIGSTOP, a
machine that stopped answering) has the kernel accept the connection and never answers (gone after
~3.2 s of silence). docs/EXACTLY_ONCE.md ("A hot standby") says why those numbers, and why taking
over is safe whatever the standby gets wrong about liveness.

Taking over is a start with `take_over` (eos.launch): fence every earlier driver through the
driver id, record this one, recover, start the query. What the standby saves is what a cold start
spends before that: a JVM, a SparkSession, the pipeline's checks and plan, Spark's Python workers
and the first streaming query's start-up (Warmer). Just before, it reads the checkpoint's metadata
again (`reopen`): the checkpoint changed while the standby waited.

Two standbys never both run the pipeline: one whose recorded driver changed since it began watching
watches the new one (it reads the control log again just before fencing), and one whose take-over
another fenced (DriverFenced at its first write under the driver id) stands by again instead of
running (`run_standby`).
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Pending
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos.errors import CheckpointError, ConfigError, DriverFenced, EosError
from eos.protocol.channel import Liveness, ping
from eos.protocol.decision import ControlLog, DriverInfo
from eos.startup import open_checkpoint

if TYPE_CHECKING:
    from eos.config import PipelineConfig
    from eos.launch import StartOptions
    from eos.pipeline import Pipeline
    from eos.query import EosQuery, RunResult
    from eos.runner import RunOptions

PING_INTERVAL_S = 0.5  # between pings while the driver answers
PING_TIMEOUT_S = 1.0  # one ping: connect and answer
RETRY_S = 0.1  # after a failed ping
MISSES = 3  # failed pings in a row: the driver is gone
READ_TIMEOUT_S = 2.0  # a read of the control log that takes longer is not waited for (below)
WARM_S = 30.0  # a job through the Python workers this often (Spark ends workers idle for a minute)
_WARMED: set[str] = set()  # Spark applications whose throwaway streaming query has run


class RebuildNeeded(CheckpointError):
    """The checkpoint changed under the standby in a way its pipeline, as built, cannot replay."""


@dataclass(frozen=True)
class Gone:
    """The verdict on a watched driver."""

    driver: DriverInfo | None  # None: no driver is recorded
    why: str


def describe(driver: DriverInfo) -> str:
    return f"pid {driver.pid} on {driver.host} (run {driver.run}, vote service {driver.address})"


_UNKNOWN = object()


def _recorded(control: ControlLog, reader: ThreadPoolExecutor) -> DriverInfo | object | None:
    """The recorded driver, or _UNKNOWN when the read takes over READ_TIMEOUT_S: a read waits until
    no transaction is open on the control log, and a driver that stalled inside one of its writes
    (a decision, say) keeps it open until its transaction times out. Fencing ends it at once."""
    try:
        return reader.submit(control.previous_driver).result(READ_TIMEOUT_S)
    except Pending:
        return _UNKNOWN


def watch(
    control: ControlLog,
    say: Callable[[str], None],
    stop: threading.Event,
    liveness: Callable[[DriverInfo, float], Liveness] = ping,
) -> Gone | None:
    """Watch the driver the control log records until it is gone; None if `stop` was set first.
    A failed ping is one that is refused, times out, or is answered by something that cannot prove
    it is the recorded driver."""
    driver = control.previous_driver()
    if driver is None:
        return Gone(None, "no driver is recorded for this pipeline")
    say(f"standing by: watching the driver {describe(driver)}")
    misses, why, slowest = 0, "", 0.0
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eos-standby-read")
    try:
        while not stop.is_set():
            sent = time.monotonic()
            answer = liveness(driver, PING_TIMEOUT_S)
            took = time.monotonic() - sent
            if answer is Liveness.ALIVE:
                misses, slowest = 0, max(slowest, took)
            else:
                misses += 1
                why = f"{misses} pings in a row failed (the last: {answer.value}, after {took:.2f} s)"
            if misses >= MISSES:
                # Is it still the recorded driver? A driver that took over since (another standby, a
                # restart) is the one to watch.
                recorded = _recorded(control, reader)
                if recorded is None:
                    return Gone(None, "the pipeline's control records were reset")
                if isinstance(recorded, DriverInfo) and recorded.run != driver.run:
                    driver, misses = recorded, 0
                    say(f"the pipeline's driver changed: now watching {describe(driver)}")
                    continue
                return Gone(driver, f"{why}; its slowest answer while watched: {slowest * 1000:.0f} ms")
            stop.wait(max(0.0, (PING_INTERVAL_S if misses == 0 else RETRY_S) - (time.monotonic() - sent)))
    finally:
        reader.shutdown(wait=False, cancel_futures=True)  # a read still waiting ends on its own
    return None


def reopen(pipeline: Pipeline) -> None:
    """Read the checkpoint's metadata again, as at a start: it changed while the standby waited.
    The pins of the sources, with which their DataFrames were built, never change over a
    checkpoint's life; its identity, the pending epoch, the replay config and the poison
    decisions may have. Raises RebuildNeeded when the pipeline as built cannot go on from here."""
    header = pipeline.header
    opened = open_checkpoint(pipeline.checkpoint, header.name, header.epochs.mode)
    built = pipeline.opened
    if built.meta is None and opened.meta is None:
        return  # still a new checkpoint: the pipeline was built for one (a new id, new pins)
    if opened.checkpoint_id != built.checkpoint_id:
        raise RebuildNeeded(
            f"the checkpoint {pipeline.checkpoint.uri} was {'created' if built.meta is None else 'replaced'} while "
            "this standby waited: its sources are pinned anew, and the standby's pipeline was built without those pins",
            hint="build the pipeline again and stand by again (`eos run --standby` does it by itself)",
        )
    if header.epochs.slots is None and opened.meta is not None and opened.pending is not None:
        # A pending epoch is replayed with its own slot count: a record's slot depends on it.
        wanted = int(opened.meta.replay.get("parallelism", pipeline.parallelism))
        if wanted != pipeline.parallelism:
            raise RebuildNeeded(
                f"epoch {opened.pending} is pending with {wanted} slots and must be replayed with them; the standby's "
                f"pipeline was built with {pipeline.parallelism}",
                hint=f"set epochs.slots to {wanted}, or build the pipeline again and stand by again (`eos run "
                "--standby` does it by itself)",
            )
    pipeline.opened = opened


def refuse(exactly_once: bool, take_over: bool, finish_pending: bool) -> None:
    """What a standby cannot be asked for (checked before Spark starts, by `eos run`)."""
    if take_over or finish_pending:
        raise ConfigError(
            "a standby takes the pipeline over by itself, when its driver is gone: not with --take-over "
            "(take_over) or --finish-pending (finish_pending)"
        )
    if not exactly_once:
        raise ConfigError(
            "a standby needs `epochs.mode: exactly-once`: at-least-once has no driver id with which to fence a driver "
            "that only seems gone, and two drivers would both write"
        )


def stand_by(pipeline: Pipeline, options: StartOptions) -> EosQuery | None:
    """Stand by with a built pipeline until the recorded driver is gone, then take the pipeline
    over and return the running query (None: `options.stop` was set first). Raises RebuildNeeded,
    or DriverFenced when another driver took the pipeline over in the same moment."""
    from eos.launch import launch

    def say(message: str) -> None:
        print(f"eos: {pipeline.name}: {message}", file=sys.stderr, flush=True)

    refuse(pipeline.header.exactly_once, options.take_over, options.finish_pending)
    stop = options.stop or threading.Event()
    control = pipeline.connectors().sources[0].control_log()
    warmer = Warmer(pipeline)
    try:
        warmer.prepare()
        gone = watch(control, say, stop)
    finally:
        warmer.close()
        control.close()
    if gone is None:
        pipeline.close()  # no take-over: launch, which closes the connectors when it ends, never ran
        return None
    judged = time.monotonic()
    say(f"the driver is gone ({gone.why}): taking over" if gone.driver else f"{gone.why}: taking over")
    try:
        reopen(pipeline)
    except RebuildNeeded:
        pipeline.close()
        raise
    query = launch(pipeline, replace(options, take_over=True))
    after = time.monotonic() - judged
    say(f"took over as run {pipeline.run_id} {after:.2f} s after the driver was judged gone; running")
    return query


class Warmer:
    """Keeps the standby's Spark ready for the take-over. Once (`prepare`): the query's plan (the
    union of every sink's rows, checked against the output mode: a pipeline that cannot run fails
    now, not at the take-over), the modules a start imports, and a throwaway streaming query that
    starts what a pipeline's first micro-batch starts: two scans of a Python streaming source (a
    tiny one of its own, `_warm_source`: Spark's source runners and the Python processes that plan
    a Python source's reads), foreachBatch and the callback server it calls back through, the
    micro-batch machinery, and Spark's Python workers, with the connectors' modules imported. Its
    checkpoint is a temporary folder of its own, deleted at once. Then, on a thread of its own, a
    tiny job through those workers every WARM_S, until `close`."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        found = pipeline.connectors()
        self.modules = sorted({type(c).__module__ for c in [*found.sources, *found.sinks]} | {"eos.protocol.slot"})
        self.closed = threading.Event()

    def prepare(self) -> None:
        import importlib

        from eos.analysis import check_output_mode

        stream, _ = self.pipeline.union()
        check_output_mode(self.pipeline.spark, stream, self.pipeline.header.epochs.output_mode)
        for module in ("eos.observe.metrics", "eos.observe.progress", "rich.console", "rich.spinner"):
            importlib.import_module(module)  # what a start imports on its way (eos.launch)
        context = self.pipeline.spark.sparkContext.applicationId
        if context not in _WARMED:  # a standby that stands by again is warm already
            self._throwaway_query()
            _WARMED.add(context)
        threading.Thread(target=self._keep_warm, name="eos-standby-warm", daemon=True).start()

    def close(self) -> None:
        self.closed.set()

    def _keep_warm(self) -> None:
        slots = self.pipeline.parallelism
        while not self.closed.wait(WARM_S):
            try:
                self._job(self.pipeline.spark.range(0, slots, 1, slots))
            except Exception as exc:  # a warm-up is never worth failing the standby for
                _say(self.pipeline.name, f"the standby's warm-up job failed: {exc}")

    def _job(self, rows: Any) -> None:
        modules = self.modules

        def imported(batches: Any) -> Any:
            import importlib

            for module in modules:
                importlib.import_module(module)
            yield from batches

        # Two Python steps per task, as an epoch's task has (the source's read, the slots' write):
        # each holds a worker of its own.
        rows.mapInArrow(imported, rows.schema).mapInArrow(imported, rows.schema).collect()

    def _throwaway_query(self) -> None:
        spark, slots = self.pipeline.spark, self.pipeline.parallelism
        spark.dataSource.register(_warm_source())
        folder = tempfile.mkdtemp(prefix="eos-standby-warm-")
        try:
            scans = [spark.readStream.format(WARM_SOURCE).option("partitions", slots).load() for _ in range(2)]
            rows = scans[0].union(scans[1])  # two scans, as a pipeline's source has (its rows, its poison)
            query = (
                rows.writeStream.foreachBatch(lambda batch, _: self._job(batch))
                .option("checkpointLocation", folder)
                .trigger(once=True)
                .start()
            )
            if not query.awaitTermination(120):
                query.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


WARM_SOURCE = "eos-standby-warm"


def _warm_source() -> type:
    """A Python streaming source of one row per partition, `slots` partitions, in one batch."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"batch": 0}

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"batch": 1}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition(n) for n in range(int(self.options.get("partitions", 2)))]

        def read(self, partition: InputPartition) -> Any:
            yield (partition.value,)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return WARM_SOURCE

        def schema(self) -> str:
            return "n INT"

        def streamReader(self, schema: Any) -> Reader:
            reader = Reader()
            reader.options = self.options
            return reader

    return Source


# ---------------------------------------------------------------------------------------------
# eos run --standby
# ---------------------------------------------------------------------------------------------


def run_standby(
    config: PipelineConfig, base_dir: Path | None, spark: Any, options: RunOptions, prechecked: bool = False
) -> RunResult:
    """`eos run --standby`: stand by, take over, run; stand by again when another driver took the
    pipeline over from this one (at its take-over or later). SIGTERM/SIGINT stop the standing by;
    once it runs, they stop the run as they stop `eos run`."""
    from eos.query import RunResult
    from eos.runner import wait

    total = RunResult(config.name)
    stop = threading.Event()
    handlers = options.install_signal_handlers and threading.current_thread() is threading.main_thread()
    while True:
        previous = _stop_on_signals(stop) if handlers else {}
        try:
            pipeline = _build(config, base_dir, spark, options, prechecked)
            prechecked = False  # a build after standing by again checks the systems again
            query = pipeline.start(
                options.trigger,
                standby=True,
                stop=stop,
                progress=options.progress,
                metrics_port=options.metrics_port,
                metrics_host=options.metrics_host,
                listeners=options.listeners,
            )
        except (RebuildNeeded, DriverFenced) as exc:
            _say(config.name, f"{exc.message}: standing by again")
            continue
        finally:
            _restore(previous)
        if query is None:
            total.stopped_by = "stopped while standing by"
            return total
        if stop.is_set():  # the signal came while it took over: stop as `eos run` would
            query.request_stop()
        try:
            stopped_by = wait(query, options.install_signal_handlers)
        except EosError as exc:
            _add(total, query.result)
            if not _taken_from(pipeline):
                raise
            _say(config.name, f"another driver took the pipeline over ({exc.message}): standing by again")
            continue
        _add(total, query.result)
        total.stopped_by = stopped_by
        return total


def _build(
    config: PipelineConfig, base_dir: Path | None, spark: Any, options: RunOptions, prechecked: bool = False
) -> Pipeline:
    """The pipeline, built with the slot count the running driver recorded in the checkpoint when
    the file leaves `slots` unset: an epoch pending at the take-over must be replayed with it."""
    from eos.protocol.checkpoint import Checkpoint
    from eos.yamlpipeline import build_pipeline

    parallelism = None
    if config.epochs.slots is None:
        meta = Checkpoint(config.checkpoint_path(base_dir), spark).read_meta()
        if meta is not None and "parallelism" in meta.replay:
            parallelism = int(meta.replay["parallelism"])
    return build_pipeline(config, base_dir, spark, options.failpoints, prechecked=prechecked, parallelism=parallelism)


def _taken_from(pipeline: Pipeline) -> bool:
    """Whether another driver is recorded now: this one was fenced (or caused a failure by racing it)."""
    control = pipeline.connectors().sources[0].control_log()
    try:
        recorded = control.previous_driver()
    except Exception:
        return False
    finally:
        control.close()
    return recorded is not None and recorded.run != pipeline.run_id


def _say(pipeline: str, message: str) -> None:
    print(f"eos: {pipeline}: {message}", file=sys.stderr, flush=True)


def _add(total: RunResult, result: RunResult) -> None:
    total.epochs_committed += result.epochs_committed
    for sink, n in result.records_out.items():
        total.records_out[sink] = total.records_out.get(sink, 0) + n


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


__all__ = ["MISSES", "PING_INTERVAL_S", "PING_TIMEOUT_S", "RebuildNeeded", "run_standby", "stand_by", "watch"]

"""Per-epoch progress for people, and Spark's own progress as events.

One permanent line per committed epoch: offsets in and records out (per sink, then the
dead-letter queues), the rate, the time each phase took (Spark's planning, the job that reads,
writes and pre-commits every slot, recording the decision, the commit, Spark's commit log), the
slots and their producers (reused or initialised), and the source lag, in offsets and in seconds
(the age of the oldest record not yet committed). The first epoch of a run shows no rate: it also
starts Spark's Python workers and plans the query, so its rate would say little about the
pipeline; `RunRate` gives the run's rate after it. Recoveries and aborted attempts get a line of
their own. On a
terminal a transient status line below them shows the epoch in flight and its phase (write with
the transactions prepared so far, decide, commit k/n, mark committed), refreshed four times a
second; anywhere else (a pipe, a log file, TERM=dumb) only the plain lines are written.

SparkProgressBridge turns Spark's StreamingQueryListener callbacks into `on_spark_progress`
calls, once per batch, and catches up from the query's recent progress when the query ends (the
listener bus is asynchronous: the last batch's event can arrive after the query stopped). It
takes each progress as the JSON Spark writes of it, never through PySpark's event objects (see
_ProgressAsJson).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any, ClassVar

from pyspark.sql.streaming import StreamingQueryListener

from eos.observe.lag import LagMonitor, age, as_line, consumed
from eos.observe.tracker import EpochTracker
from eos.protocol.report import EpochListener, EpochReport, RecoveryReport

log = logging.getLogger("eos.observe.progress")
PLAN_KEYS = ("latestOffset", "walCommit", "queryPlanning", "getBatch")


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f}ms" if seconds < 0.1 else f"{seconds * 1000:.0f}ms"


DLQ_SUFFIX = ".dlq"  # a source's dead-letter queue is the sink "<source>.dlq"
START_UP = "first epoch of the run: also starts the Python workers and plans the query, no rate"


def outputs(records_out: Mapping[str, int], sinks: Iterable[str] = ()) -> str:
    """Records out per sink (`sinks` first, in their order, 0 where the epoch wrote none), then per
    dead-letter queue: "totals 12, totals_pg 12, dlq 3" (with several: "dlq orders 2, dlq refunds 1")."""
    counts = {name: 0 for name in sinks} | dict(records_out)
    written = [f"{name} {n:,}" for name, n in counts.items() if not name.endswith(DLQ_SUFFIX)]
    dead = [(name.removesuffix(DLQ_SUFFIX), n) for name, n in counts.items() if name.endswith(DLQ_SUFFIX)]
    written += [f"dlq {n:,}" if len(dead) == 1 else f"dlq {source} {n:,}" for source, n in dead]
    return ", ".join(written) or "0"


def lag_text(offsets: int | None, seconds: float | None) -> str:
    """The lag part of a line, " | lag 1,200 (oldest 4.2s)": offsets behind, and how long the
    oldest record not yet committed has waited (when the sources tell)."""
    if offsets is None:
        return ""
    oldest = f" (oldest {age(seconds)})" if offsets and seconds is not None else ""
    return f" | lag {offsets:,}{oldest}"


def epoch_line(
    report: EpochReport,
    progress: dict[str, Any] | None,
    lag: int | None = None,
    consumed: int | None = None,
    exactly_once: bool = True,
    start_up: bool = False,
    lag_s: float | None = None,
    sinks: Iterable[str] = (),
) -> str:
    """The permanent line of a committed epoch. "in" is the offsets the epoch consumed when known
    (Spark's numInputRows counts a source once per scan: twice with a dead-letter split).
    `start_up`: the run's first epoch, whose rate is not shown (see the module doc)."""
    out = sum(report.records_out.values())
    records_in = consumed if consumed is not None else (progress.get("numInputRows") if progress else None)
    durations = (progress or {}).get("durationMs", {})
    total_s = durations.get("triggerExecution", report.job_s * 1000) / 1000
    rate = (records_in if records_in is not None else out) / total_s if total_s > 0 else 0.0
    plan_ms = sum(durations.get(k, 0) for k in PLAN_KEYS)
    leased = [w for slot in report.slots for w in slot.sinks.values() if w.prepared is not None and exactly_once]
    reused = sum(1 for w in leased if w.reused)
    extras = []
    if any(report.replay_skipped.values()) or report.skipped_slots:
        extras.append(f"replay: {report.skipped_slots} slot(s) already committed, skipped")
    if report.counted_only:
        extras.append(f"poison skipped: {sum(report.counted_only.values())}")
    if report.attempts > 1:
        extras.append(f"attempts {report.attempts}")
    mark = f" mark {durations['commitOffsets']}ms" if "commitOffsets" in durations else ""
    plan = f"plan {plan_ms:.0f}ms " if progress is not None else ""
    return (
        f"epoch {report.epoch} committed | in {f'{records_in:,}' if records_in is not None else '?'} | "
        f"out: {outputs(report.records_out, sinks)} | {START_UP if start_up else f'{rate:,.0f} rec/s'} | "
        f"{plan}job {_ms(report.job_s)} decide {_ms(report.decide_s)} "
        f"commit {_ms(report.commit_s)}{mark} | {len(report.slots)} slots"
        + (f", {len(leased)} txns ({reused} producers reused)" if leased else "")
        + lag_text(lag, lag_s)
        + (f" | {'; '.join(extras)}" if extras else "")
    )


class ProgressPrinter(EpochListener):
    """Writes the progress lines to `out`; live (rich) when `out` is a terminal, unless `live`
    says otherwise."""

    def __init__(
        self,
        pipeline: str,
        out: IO[str],
        tracker: EpochTracker | None = None,
        lag: LagMonitor | None = None,
        live: bool | None = None,
    ):
        self.pipeline = pipeline
        self.out = out
        self.tracker = tracker
        self.lag = lag
        self._lock = threading.Lock()
        self._reports: dict[int, EpochReport] = {}
        self._last: str = ""
        self._lines = 0  # epoch lines printed: the first is the run's start-up epoch
        self._sinks: dict[str, None] = {}  # every sink an epoch of this run wrote to, in order
        self._console = None
        self._live = None
        self._spinner = None
        if live is None:
            from rich.console import Console

            console = Console(file=out)
            live = console.is_terminal and not console.is_dumb_terminal
        if live and tracker is not None:
            from rich.console import Console
            from rich.spinner import Spinner

            self._console = Console(file=out, highlight=False, force_terminal=True)
            self._spinner = Spinner("dots", style="cyan")

    # -- output ----------------------------------------------------------------------------------
    def _print(self, line: str) -> None:
        text = f"[{self.pipeline}] {line}"
        if self._console is not None:
            self._console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.out, flush=True)

    def _status(self) -> Any:
        assert self._spinner is not None and self.tracker is not None
        phase = self.tracker.phase().describe()
        parts = [f"[{self.pipeline}] {phase}"]
        if self.lag is not None and (lag := lag_text(self.lag.total(), self.lag.oldest_age_s())):
            parts.append(lag.removeprefix(" | "))
        if self._last:
            parts.append(f"last: {self._last}")
        from rich.text import Text

        self._spinner.update(text=Text(" | ".join(parts)))  # Text: "[name]" is not markup
        return self._spinner

    def _ensure_live(self) -> None:
        if self._console is None or self._live is not None:
            return
        from rich.live import Live

        self._live = Live(
            console=self._console, get_renderable=self._status, transient=True, refresh_per_second=4,
            redirect_stdout=False, redirect_stderr=False,
        )  # fmt: skip
        self._live.start()

    # -- events ----------------------------------------------------------------------------------
    def on_recovery(self, report: RecoveryReport) -> None:
        slots = ", ".join(f"{sink}/{slot}:{entry.epoch}" for (sink, slot), entry in sorted(report.ledger.items()))
        resolved = ", ".join(f"{n} {what}" for what, n in sorted(report.resolved.items()) if n)
        self._print(
            f"recovery ({report.reason}): fenced {report.fenced_ids} transactional ids"
            + (f", resolved {resolved}" if resolved else "")
            + f" in {_ms(report.duration_s)}; ledger: {slots or 'empty'}"
        )

    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        self._ensure_live()

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        then = "retrying after fencing" if retrying else "giving up"
        self._print(f"epoch {epoch} attempt {attempt} ABORTED: {reason}; {then}")

    def on_epoch_committed(self, report: EpochReport) -> None:
        with self._lock:
            self._reports[report.epoch] = report

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        with self._lock:
            report = self._reports.pop(progress.get("batchId", -1), None)
        if report is not None:
            self._line(report, progress)

    def flush(self) -> None:
        """Print what is pending (epochs whose Spark progress never came) and stop the live line."""
        with self._lock:
            pending, self._reports = self._reports, {}
        for report in sorted(pending.values(), key=lambda r: r.epoch):
            self._line(report, None)
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _line(self, report: EpochReport, progress: dict[str, Any] | None) -> None:
        lag = records_in = lag_s = None
        if self.lag is not None:
            if progress is not None:
                records_in = sum(self.lag.on_progress(progress).values())
                # The lag after this epoch, not before it: its query runs on the monitor thread.
                self.lag.wait_fresh(timeout_s=2.0)
            lag, lag_s = self.lag.total(), self.lag.oldest_age_s()
        exactly_once = self.tracker.exactly_once if self.tracker is not None else True
        self._sinks.update(dict.fromkeys(report.records_out))
        line = epoch_line(
            report, progress, lag, records_in, exactly_once, start_up=self._lines == 0, lag_s=lag_s, sinks=self._sinks
        )
        self._lines += 1
        out = sum(report.records_out.values())
        self._last = f"epoch {report.epoch}, {out:,} out"
        self._print(line)


class RunRate(EpochListener):
    """A run's rate after start-up: the offsets its committed epochs consumed, per second of those
    epochs (Spark's triggerExecution), leaving out the run's first epoch (see the module doc).
    For the summary line of `eos run`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._committed: set[int] = set()
        self._first: int | None = None
        self.epochs = 0  # epochs after the first
        self.records = 0
        self.seconds = 0.0

    def on_epoch_committed(self, report: EpochReport) -> None:
        with self._lock:
            self._committed.add(report.epoch)
            if self._first is None:
                self._first = report.epoch

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        batch = progress.get("batchId")
        with self._lock:
            if batch not in self._committed or batch == self._first:
                return
            self._committed.discard(batch)
            self.epochs += 1
            self.records += offsets_consumed(progress)
            self.seconds += (progress.get("durationMs") or {}).get("triggerExecution", 0) / 1000

    def describe(self) -> str | None:
        """E.g. "after start-up 2,700 records in 9 epochs, 31.2 s: 86 rec/s"; None before a second epoch."""
        with self._lock:
            if not self.epochs:
                return None
            rate = f"{self.records / self.seconds:,.0f} rec/s" if self.seconds > 0 else "-"
            return f"after start-up {self.records:,} records in {self.epochs} epochs, {self.seconds:.1f} s: {rate}"


def offsets_consumed(progress: Mapping[str, Any]) -> int:
    """Offsets a batch consumed over all its sources, from Spark's progress alone. A source scanned
    twice (its poison scan) reports the same start and end twice: counted once."""
    seen: set[str] = set()
    total = 0
    for scan in progress.get("sources") or []:
        start, end = as_line(scan.get("startOffset")), as_line(scan.get("endOffset"))
        key = json.dumps([start, end], sort_keys=True)
        if key not in seen:
            seen.add(key)
            total += consumed(start, end)
    return total


def _key(progress: dict[str, Any]) -> tuple[str, int]:
    return str(progress.get("runId")), int(progress.get("batchId", -1))


def _parsed(jprogress: Any) -> dict[str, Any]:
    return json.loads(jprogress.json())


class _ProgressAsJson:
    """What Spark's listener bus calls (py4j implements Spark's Python listener interface with
    it): each progress is handed on as the JSON Spark writes of it, two JVM calls. PySpark's own
    wrapper first copies every field of every event into Python objects, a JVM call per field
    and more per source; measured on 40-record epochs, that cost ~90 ms of the JVM's CPU and
    ~18 ms of the driver's per epoch (257 -> 163 and 32 -> 15 ms), and 40 ms of the epoch's
    time, on a machine where the epoch has two cores."""

    def __init__(self, bridge: SparkProgressBridge):
        self.bridge = bridge

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            progress = _parsed(jevent.progress())
        except Exception:
            log.exception("unreadable query progress")
            return
        self.bridge.deliver(progress)

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class SparkProgressBridge(StreamingQueryListener):
    """Forwards Spark's per-batch progress (a dict) to every listener with on_spark_progress,
    once per (run, batch)."""

    def __init__(self, listeners: list[EpochListener]):
        self.listeners = listeners
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Condition()
        self._delivering = 0  # deliveries in progress (Spark's listener bus thread)
        self._java: Any = None

    @property
    def _jlistener(self) -> Any:
        """The Java listener `spark.streams.addListener` registers (PySpark's hook): the bridge's
        own, instead of PySpark's wrapper around the on* methods below."""
        if self._java is None:
            from pyspark import SparkContext

            self._java = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
        return self._java

    def deliver(self, progress: dict[str, Any]) -> bool:
        """Hand one progress to the listeners unless it was delivered before."""
        key = _key(progress)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            self._delivering += 1
        try:
            for listener in self.listeners:
                handler = getattr(listener, "on_spark_progress", None)
                if handler is None:
                    continue
                try:
                    handler(progress)
                except Exception:  # an observer must never break Spark's listener bus
                    log.exception("%s.on_spark_progress failed", type(listener).__name__)
        finally:
            with self._lock:
                self._delivering -= 1
                self._lock.notify_all()
        return True

    def catch_up(self, query: Any, wait_s: float = 2.0) -> int:
        """Deliver the progress of batches whose listener event has not arrived (yet): waits up
        to wait_s for the bus first, then feeds them from the query's recent progress, then waits for
        deliveries in progress to end. Returns how many it fed."""
        deadline = time.monotonic() + wait_s
        fed = 0
        try:
            recent = {_key(p): p for p in (_parsed(j) for j in query._jsq.recentProgress())}
        except Exception:
            log.exception("cannot read the query's recent progress")
            return fed
        with self._lock:  # every delivery notifies: no polling interval added to a stop
            self._lock.wait_for(lambda: recent.keys() <= self._seen, timeout=wait_s)
            missing = [p for key, p in recent.items() if key not in self._seen]
        for progress in missing:
            fed += self.deliver(progress)
        # A delivery the bus started may still run: let it finish before the run closes the
        # metrics server and the printer under it.
        with self._lock:
            self._lock.wait_for(lambda: self._delivering == 0, timeout=max(0.0, deadline - time.monotonic()) + 5)
        return fed

    # PySpark's abstract listener: called only where PySpark's own wrapper is registered (Spark
    # calls _ProgressAsJson otherwise).
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = json.loads(event.progress.json)
        except Exception:
            log.exception("unreadable query progress")
            return
        self.deliver(progress)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

"""How far behind its sources a pipeline is, and whether transactions linger in its sinks.

Core code: it knows sources and sinks only through the connector API (eos.api), never a
connector's own modules.

Source lag comes from `SourceConnector.lag(line)`: given the source's *line* of the last committed
epoch (what Spark logs for the source in its offset log, and reports as `sources[i].endOffset` in
its progress), the source tells, per partition, the newest readable offset and the committed one.
Spark's source i is the pipeline's source i (one Spark source per configured source). The
committed line comes from each batch's progress while the pipeline runs, and at start from the
checkpoint's offset log of the last committed epoch (a new checkpoint: the source's pinned start,
see `pinned_line`). The sources are asked on a background thread, every `interval_s` and right
after each epoch, never on Spark's listener bus or the pipeline's path: a slow or unreachable
system keeps the last numbers and counts a failure.

Offsets consumed per epoch are the difference between the epoch's end and start lines, summed
over their numeric leaves (for Kafka: over partitions); a leaf the start does not have (a new
partition) counts from 0.

Lingering transactions come from `SinkConnector.lingering()`: a list of one line per open
transaction (or per position it pins). The watch asks every sink every `linger_interval_s` and
reports, per sink, how long the oldest of its lines has stayed the same. An item's identity is
its text up to " < " (the Kafka sink reports "topic/partition: stable S < end H": the partition
and the offset its last stable offset is stuck at, whatever the high watermark does since). Our
own epochs move the stable offset every epoch, so a line that stays means a transaction lingers.

A third, slow watch (every `driver_interval_s`) reads the control log's last driver: once it is
another run than ours, this driver has been fenced (another driver took the pipeline over).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eos.protocol.decision import DriverInfo
from eos.protocol.sink import SinkConnector
from eos.protocol.source import PartitionLag, SourceConnector

log = logging.getLogger("eos.observe.lag")

Line = dict[str, Any]


def as_line(value: Any) -> Line | None:
    """A source's line as Spark hands it: a dict, a JSON string, or nothing."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def leaves(value: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """The numeric leaves of a line by their path ({"t": {"0": 5}} -> {("t", "0"): 5})."""
    if isinstance(value, Mapping):
        out: dict[tuple[str, ...], int] = {}
        for key, item in value.items():
            out.update(leaves(item, (*path, str(key))))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {path: int(value)}
    return {}


def consumed(start: Line | None, end: Line | None) -> int:
    """Offsets between two lines of one source, summed over their leaves (missing start: 0)."""
    before = leaves(start or {})
    return sum(max(0, offset - before.get(path, 0)) for path, offset in leaves(end or {}).items())


def pinned_line(pin: Mapping[str, Any] | None) -> Line | None:
    """Where a new checkpoint starts reading a source, when its pin says so in the shape of its
    lines under `starting` (the Kafka source's resolved starting offsets). Spark reports no start
    for the first epoch of a new checkpoint, and the API has no other way to ask."""
    starting = (pin or {}).get("starting")
    return starting if isinstance(starting, dict) and leaves(starting) else None


def committed_lines(
    checkpoint: Any, sources: list[SourceConnector], pins: Mapping[str, Any] | None
) -> list[Line | None]:
    """Each source's line of the checkpoint's last committed epoch; for a source with nothing
    committed yet, its pinned start (or None)."""
    lines: list[Line | None] = [pinned_line((pins or {}).get(s.name)) for s in sources]
    epoch = checkpoint.last_committed_epoch()
    if epoch is not None:
        logged = [as_line(line) for line in checkpoint.logged_offsets(epoch)]
        for index, source in enumerate(sources):
            lines[index] = line_of(source, logged) or lines[index]
    return lines


def line_of(source: SourceConnector, lines: Iterable[Line | None]) -> Line | None:
    """The first of these lines (Spark's, one per scan, in the plan's order) that is the source's."""
    return next((line for line in lines if line and source.owns(line)), None)


def source_lag(sources: list[SourceConnector], lines: list[Line | None]) -> list[PartitionLag]:
    """Every source's lag now (one round of queries; raises what the sources raise)."""
    rows: list[PartitionLag] = []
    for source, line in zip(sources, lines, strict=True):
        rows += source.lag(line)
    return rows


def age(seconds: float | None) -> str:
    """A lag in event time: "0.4s", "12s", "3m05s", "2h10m"."""
    if seconds is None:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


@dataclass(frozen=True)
class Lingering:
    sink: str
    item: str  # what the sink reported
    seconds: float  # how long the item has been seen unchanged (0 on first sight)


def identity(item: str) -> str:
    return item.split(" < ", 1)[0]


class LingerWatch:
    """How long each sink's lingering items have stayed (see the module doc)."""

    def __init__(self, sinks: Iterable[SinkConnector]):
        self.sinks = list(sinks)
        self._since: dict[tuple[str, str], tuple[str, float]] = {}  # (sink, identity) -> (item, first seen)
        self._lock = threading.Lock()
        self.failures = 0

    def refresh(self) -> None:
        now = time.monotonic()
        for sink in self.sinks:
            try:
                items = sink.lingering()
            except Exception as exc:  # monitoring only
                self.failures += 1
                log.debug("sink %s: lingering(): %s", sink.name, exc)
                continue
            with self._lock:
                seen = {identity(item): item for item in items}
                for key in [k for k in self._since if k[0] == sink.name and k[1] not in seen]:
                    del self._since[key]
                for ident, item in seen.items():
                    first = self._since.get((sink.name, ident), (item, now))[1]
                    self._since[(sink.name, ident)] = (item, first)

    def items(self) -> list[Lingering]:
        now = time.monotonic()
        with self._lock:
            return [Lingering(sink, item, now - since) for (sink, _), (item, since) in sorted(self._since.items())]

    def stuck_seconds(self) -> dict[str, float]:
        """Per sink, how long its oldest lingering item has stayed (0 when none)."""
        out = {sink.name: 0.0 for sink in self.sinks}
        for row in self.items():
            out[row.sink] = max(out.get(row.sink, 0.0), row.seconds)
        return out

    def counts(self) -> dict[str, int]:
        out = {sink.name: 0 for sink in self.sinks}
        for row in self.items():
            out[row.sink] = out.get(row.sink, 0) + 1
        return out


class DriverWatch:
    """Whether another driver took the pipeline over since this one started (read from the
    control log: its last driver is another run than ours)."""

    def __init__(self, previous_driver: Callable[[], DriverInfo | None], run: str):
        self.previous_driver = previous_driver
        self.run = run
        self.taken_over_by: DriverInfo | None = None
        self.failures = 0

    def refresh(self) -> None:
        try:
            driver = self.previous_driver()
        except Exception as exc:  # monitoring only
            self.failures += 1
            log.debug("control log: %s", exc)
            return
        if driver is not None and driver.run != self.run:
            self.taken_over_by = driver


class LagMonitor:
    """Live source lag of a running pipeline, plus the lingering and driver watches (driver side,
    thread-safe). See the module doc."""

    def __init__(
        self,
        sources: list[SourceConnector],
        committed: list[Line | None] | None = None,
        sinks: Iterable[SinkConnector] = (),
        interval_s: float = 2.0,
        linger_interval_s: float = 5.0,
        driver: DriverWatch | None = None,
        driver_interval_s: float = 30.0,
    ):
        self.sources = list(sources)
        self.names = [s.name for s in self.sources]
        self.interval_s = interval_s
        self.linger_interval_s = linger_interval_s
        self.driver_interval_s = driver_interval_s
        self._lock = threading.Lock()
        self._lines: list[Line | None] = list(committed or [None] * len(self.sources))
        self._consumed: dict[tuple[str, int], dict[str, int]] = {}
        self._rows: list[PartitionLag] = []
        self._version = 0  # bumped when a committed line changes
        self._rows_version = -1  # the version the rows were queried for
        self.lingering = LingerWatch(sinks)
        self.driver = driver
        self.failures = 0
        self.queries = 0
        self.last_error: str | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_linger = 0.0
        self._next_driver = time.monotonic() + driver_interval_s

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LagMonitor:
        """Query on the background thread at once (the first epoch's lag is known soon), then keep
        refreshing. Start-up never waits on a source's system."""
        self._thread = threading.Thread(target=self._loop, name="eos-lag", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self.refresh()
            now = time.monotonic()
            if self.lingering.sinks and now >= self._next_linger:
                self._next_linger = now + self.linger_interval_s
                self.lingering.refresh()
            if self.driver is not None and now >= self._next_driver:
                self._next_driver = now + self.driver_interval_s
                self.driver.refresh()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def owner_of(self, end_offset: Any) -> str | None:
        """The name of the source a scan's reported end offsets belong to, if any."""
        line = as_line(end_offset)
        return next((s.name for s in self.sources if line and s.owns(line)), None)

    # -- updates ---------------------------------------------------------------------------------
    def on_progress(self, progress: Mapping[str, Any]) -> dict[str, int]:
        """Take a batch's end lines from Spark's progress as the committed position; returns the
        offsets the batch consumed per source. Idempotent per batch (the metrics and the progress
        line both ask); cheap (no I/O): the background thread is woken to query."""
        key = (str(progress.get("runId")), int(progress.get("batchId", -1)))
        sources = progress.get("sources") or []
        with self._lock:
            if key in self._consumed:
                return self._consumed[key]
            out: dict[str, int] = {}
            for index, (name, source) in enumerate(zip(self.names, self.sources, strict=True)):
                reported = next((r for r in sources if (e := as_line(r.get("endOffset"))) and source.owns(e)), None)
                end = as_line(reported.get("endOffset")) if reported else None
                if reported is None or end is None:
                    continue
                start = as_line(reported.get("startOffset")) or self._lines[index]
                out[name] = consumed(start, end)
                if end != self._lines[index]:
                    self._lines[index] = end
                    self._version += 1
            self._consumed = {**dict(list(self._consumed.items())[-8:]), key: out}
        self._wake.set()
        return out

    def refresh(self) -> bool:
        """One round of lag queries; False if it failed (the last numbers stay)."""
        with self._lock:
            lines, version = list(self._lines), self._version
        try:
            rows = source_lag(self.sources, lines)
        except Exception as exc:  # monitoring only: never let it break anything
            with self._lock:
                self.failures += 1
                first = self.last_error is None
                self.last_error = f"{type(exc).__name__}: {exc}"
            if first:
                log.warning("source lag: cannot query the sources: %s", self.last_error)
            return False
        with self._lock:
            if version >= self._rows_version:  # never replace newer numbers with older ones
                self._rows, self._rows_version = rows, version
            self.queries += 1
            self.last_error = None
        return True

    def wait_fresh(self, timeout_s: float = 10.0) -> bool:
        """Wait until the numbers reflect the latest committed lines (tests, the last progress
        line of a run)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                fresh = self._rows_version == self._version
            if fresh:
                return True
            self._wake.set()
            time.sleep(0.05)
        return False

    # -- reading ---------------------------------------------------------------------------------
    def snapshot(self) -> list[PartitionLag]:
        with self._lock:
            return list(self._rows)

    def total(self) -> int | None:
        rows = self.snapshot()
        return sum(r.lag for r in rows) if rows else None

    def oldest_age_s(self) -> float | None:
        """Seconds the oldest record not yet committed has waited, over every partition (0 when
        nothing lags; None when a lagging partition's age is unknown, or nothing was queried)."""
        return oldest_age(self.snapshot(), time.time())


def oldest_age(rows: Iterable[PartitionLag], now: float) -> float | None:
    """The longest wait of a record not yet committed, over the lagging partitions whose oldest
    record's time is known: 0 when nothing lags, None when no lagging partition's time is known."""
    rows = list(rows)
    lagging = [r for r in rows if r.lag]
    if not lagging:
        return 0.0 if rows else None
    known = [now - r.oldest for r in lagging if r.oldest is not None]
    return max(0.0, *known) if known else None

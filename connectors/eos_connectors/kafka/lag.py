"""How far behind its sources a pipeline is, and whether open transactions pin a topic's LSO.

Source lag per partition = the partition's end offset (the last stable offset (LSO) for a
read_committed source, else the high watermark) minus the end offset of the last committed
epoch. It is counted in offsets, not records: transaction markers and aborted records take
offsets too. Used by the metrics (live), the progress lines and `eos status` (stopped).

The committed offsets come from Spark: a progress event's `sources[i].endOffset`, or the offset
log of the last committed epoch in the checkpoint. Both are lists in Spark's source order with
one JSON object {topic: {partition: offset}} per source; `by_source` maps them to source names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from eos.config import PipelineConfig, SourceConfig
from eos_connectors.kafka.clients import UnknownTopic, admin_client, describe_partitions, end_offsets
from eos_connectors.kafka.offsets import Offsets, decode

log = logging.getLogger("eos_connectors.kafka.lag")


@dataclass(frozen=True)
class PartitionLag:
    source: str
    topic: str
    partition: int
    end: int  # LSO (read_committed) or high watermark
    committed: int | None  # end offset of the last committed epoch; None if nothing committed yet

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.committed or 0))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lag": self.lag}


def _client(source: SourceConfig) -> dict[str, Any]:
    return {"bootstrap.servers": source.kafka.bootstrap, **source.kafka.config}


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str) else (value or {})


def source_names(config: PipelineConfig, per_source: Iterable[Any]) -> list[str | None]:
    """The source name of each entry of Spark's per-source offsets (dicts or JSON strings, in
    Spark's source order); None where no source matches. A source Spark reads as several
    streaming sources gets its name on each.

    Matched on the topics each entry names; when that is ambiguous (two sources reading the same
    topics from different clusters) Spark's order, which follows the config's, decides."""
    entries = [_json(e) for e in per_source]
    names: list[str | None] = []
    unclaimed = list(config.sources)
    for index, entry in enumerate(entries):
        topics = set(entry)
        matches = [s for s in unclaimed if set(s.kafka.topics) >= topics] if topics else []
        if len(matches) > 1 and index < len(config.sources) and config.sources[index] in matches:
            matches = [config.sources[index]]
        if len(matches) == 1:
            names.append(matches[0].name)
            unclaimed.remove(matches[0])
            continue
        # One config source may be several Spark sources (the same topics read twice): same name.
        again = [s for s in config.sources if topics and set(s.kafka.topics) >= topics]
        names.append(again[0].name if len(again) == 1 else None)
    return names


def by_source(config: PipelineConfig, per_source: Iterable[Any]) -> dict[str, Offsets]:
    """Spark's per-source offsets (see `source_names`) as {source name: offsets}."""
    entries = [_json(e) for e in per_source]
    return {name: decode(entry) for name, entry in zip(source_names(config, entries), entries, strict=True) if name}


def source_end_offsets(config: PipelineConfig, admins: dict[str, Any] | None = None) -> dict[str, Offsets]:
    """Current end offset of every source partition: LSO for read_committed sources."""
    admins = admins if admins is not None else {}
    ends: dict[str, Offsets] = {}
    for source in config.sources:
        admin = admins.get(source.name)
        if admin is None:
            admin = admins[source.name] = admin_client(_client(source))
        partitions = describe_partitions(admin, source.kafka.topics)
        ends[source.name] = end_offsets(admin, partitions, read_committed=source.kafka.isolation == "read_committed")
    return ends


def compute_lag(
    config: PipelineConfig, ends: Mapping[str, Offsets], committed: Mapping[str, Offsets]
) -> list[PartitionLag]:
    rows = []
    for source in config.sources:
        done = committed.get(source.name, {})
        for (topic, partition), end in sorted(ends.get(source.name, {}).items()):
            rows.append(PartitionLag(source.name, topic, partition, end, done.get((topic, partition))))
    return rows


class LagMonitor:
    """Live source lag of a running pipeline (driver side, thread-safe).

    Committed offsets are updated from Spark's progress (cheap, no I/O). End offsets are queried
    on a background thread, every `interval_s` and right after each progress event, so a slow
    or unreachable cluster never holds up Spark's listener bus or the pipeline; a failed query
    keeps the previous numbers and is counted. Lag is therefore at most one query old."""

    def __init__(
        self,
        config: PipelineConfig,
        committed: Mapping[str, Offsets] | None = None,
        interval_s: float = 2.0,
        watch_topics: Mapping[str, dict[str, Any]] | None = None,
    ):
        self.config = config
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._admins: dict[str, Any] = {}
        self._committed: dict[str, Offsets] = dict(committed or {})
        self._consumed: dict[tuple[str, int], dict[str, int]] = {}
        self._ends: dict[str, Offsets] = {}
        self.stable = StableOffsetWatch(watch_topics or {})
        self.failures = 0
        self.queries = 0
        self.last_error: str | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LagMonitor:
        """One query now (so the first epoch's lag is known), then keep refreshing."""
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="eos-lag", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=20)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if not self._stopped.is_set():
                self.refresh()

    # -- updates ---------------------------------------------------------------------------------
    def on_progress(self, progress: dict[str, Any]) -> dict[str, int]:
        """Take a batch's end offsets from Spark's progress as the committed position; returns the
        offsets the batch consumed per source (end - start over its partitions). Idempotent per
        batch, so the metrics and the progress line can both ask."""
        key = (str(progress.get("runId")), int(progress.get("batchId", -1)))
        sources = progress.get("sources") or []
        ends = [s.get("endOffset") for s in sources]
        with self._lock:
            if key in self._consumed:
                return self._consumed[key]
            consumed: dict[str, int] = {}
            for source, name in zip(sources, source_names(self.config, ends), strict=True):
                if name is None or name in consumed:  # a source Spark reads twice counts once
                    continue
                end = decode(_json(source.get("endOffset")))
                start = decode(_json(source["startOffset"])) if source.get("startOffset") else self._committed.get(name)
                start = start or {}
                consumed[name] = sum(max(0, offset - start.get(tp, 0)) for tp, offset in end.items())
                self._committed[name] = end
            self._consumed = {**dict(list(self._consumed.items())[-8:]), key: consumed}
        self._wake.set()
        return consumed

    def refresh(self) -> bool:
        """Query end offsets (and the watched topics' LSOs); returns False if that failed."""
        try:
            ends = source_end_offsets(self.config, self._admins)
        except Exception as exc:  # monitoring only: never let it break anything
            with self._lock:
                self.failures += 1
                first = self.last_error is None
                self.last_error = f"{type(exc).__name__}: {exc}"
            if first:
                log.warning("source lag: cannot query the sources' end offsets: %s", self.last_error)
            return False
        with self._lock:
            self._ends = ends
            self.queries += 1
            self.last_error = None
        try:
            self.stable.refresh()
        except Exception as exc:
            log.debug("stable offsets: %s", exc)
        return True

    # -- reading ---------------------------------------------------------------------------------
    def snapshot(self) -> list[PartitionLag]:
        with self._lock:
            return compute_lag(self.config, self._ends, self._committed)

    def total(self) -> int | None:
        rows = self.snapshot()
        return sum(r.lag for r in rows) if rows else None


class StableOffsetWatch:
    """How long each topic's last stable offset has been stuck below its high watermark.

    An open transaction holds a partition's LSO at its first offset, and every read_committed
    reader stops there. Our own epochs move the LSO every epoch; an LSO that stays put below the
    high watermark for longer than an epoch means a transaction lingers: a zombie of ours, or a
    foreign producer writing to the same topic. Reported per topic as the longest stuck time of
    its partitions (0 when every partition is stable)."""

    def __init__(self, clients: Mapping[str, dict[str, Any]]):
        self.clients = dict(clients)  # topic -> client config
        self._admins: dict[str, Any] = {}
        self._stuck: dict[tuple[str, int], tuple[int, float]] = {}  # (topic, partition) -> (LSO, since)
        self._lock = threading.Lock()

    def refresh(self) -> None:
        now = time.monotonic()
        for topic, client in self.clients.items():
            admin = self._admins.get(topic)
            if admin is None:
                admin = self._admins[topic] = admin_client(client)
            try:
                partitions = describe_partitions(admin, [topic])
            except UnknownTopic:
                continue
            high = end_offsets(admin, partitions, read_committed=False)
            stable = end_offsets(admin, partitions, read_committed=True)
            with self._lock:
                for tp, hw in high.items():
                    lso = stable.get(tp, hw)
                    if lso >= hw:
                        self._stuck.pop(tp, None)
                    elif self._stuck.get(tp, (None, 0.0))[0] != lso:
                        self._stuck[tp] = (lso, now)

    def stuck_seconds(self) -> dict[str, float]:
        now = time.monotonic()
        with self._lock:
            out = dict.fromkeys(self.clients, 0.0)
            for (topic, _), (_, since) in self._stuck.items():
                out[topic] = max(out.get(topic, 0.0), now - since)
            return out


def committed_from_checkpoint(config: PipelineConfig, checkpoint: Any, meta: Any | None) -> dict[str, Offsets]:
    """Where each source stands according to the checkpoint: the end offsets of the last epoch
    Spark marked committed, else (nothing committed yet) the resolved starting offsets."""
    committed: dict[str, Offsets] = {}
    if meta is not None:
        for name, source in meta.sources.items():
            committed[name] = decode(source.get("starting"))
    epoch = checkpoint.last_committed_epoch()
    if epoch is not None:
        committed.update(by_source(config, checkpoint.logged_offsets(epoch)))
    return committed

"""The re-settable Kafka source: a PySpark Python streaming data source ("eos-kafka").

- The driver plans each epoch's end offsets (`latestOffset`) and Spark logs them before any
  record is read: that log is the barrier. A replay reads exactly the logged ranges (I4).
- `initialOffset` returns the starting offsets eos resolved once and stored in the checkpoint,
  so it is stable across restarts.
- read_committed by default, planned up to the last stable offset; ranges end at their planned
  end offset, never at "N records read" (markers and aborted records leave offset gaps).
- Admission control: at most N offsets an epoch, spread fairly over partitions; a large range
  is split over several tasks.
- Reads yield Arrow record batches: key, value, topic, partition, offset, timestamp, headers.
- After each epoch the end offsets are committed to a consumer group, for lag monitoring only.

The planning methods run in a Python process the Spark driver starts (not in eos's own driver
process), so everything the reader needs travels in the `eos.source` option as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from eos.failpoints import Failpoints
from eos.failpoints import parse as parse_failpoints
from eos_connectors.kafka import offsets as planning
from eos_connectors.kafka.clients import (
    BrokerUnreachable,
    UnknownTopic,
    admin_client,
    consumer,
    describe_partitions,
    end_offsets,
    start_offsets,
)
from eos_connectors.kafka.range_reader import FETCH_TUNING, RangeReadError, read_range

log = logging.getLogger("eos.source")

FORMAT_NAME = "eos-kafka"
RAW_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key: string, value: binary>>"
)
ARROW_BATCH_ROWS = 20_000


class SourceError(Exception):
    """A source problem the pipeline cannot continue past without the user's decision."""


@dataclass(frozen=True)
class SourceOptions:
    name: str
    client: dict[str, Any]  # librdkafka settings: bootstrap.servers, SASL/SSL, passthrough
    topics: list[str]
    starting: dict[str, dict[str, int]]  # resolved starting offsets, encoded
    max_records_per_epoch: int | None = None
    max_records_per_task: int = 200_000
    read_committed: bool = True
    on_out_of_range: str = "fail"
    group_id: str | None = None  # consumer group for lag monitoring
    broker_wait_s: float = 120.0  # how long planning retries an unreachable broker before failing
    # A config source is read by two Spark sources (the view's rows and the poison rows), which
    # share one plan per epoch through a PlanBook under plan_dir (see KafkaStreamReader.latestOffset).
    plan_dir: str = ""
    run_id: str = ""
    follower: bool = False
    reads: bool = True  # False: plan and log offsets, read nothing (the poison branch under `fail`)
    failpoints: list[str] = field(default_factory=list)  # armed specs (tests and soak runs)
    failpoint_state: str = ""
    driver_pgid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SourceOptions:
        return cls(**json.loads(text))


class KafkaRange(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def resolve_starting_offsets(
    client: dict[str, Any], topics: list[str], starting: str | dict[str, dict[int, int]], read_committed: bool = True
) -> planning.Offsets:
    """Turn earliest / latest / explicit offsets into explicit per-partition offsets, once."""
    admin = admin_client(client)
    partitions = describe_partitions(admin, topics)
    if starting == "earliest":
        return start_offsets(admin, partitions)
    if starting == "latest":
        return end_offsets(admin, partitions, read_committed=read_committed)
    assert isinstance(starting, dict)
    resolved: planning.Offsets = {}
    for topic in topics:
        given = starting.get(topic)
        if given is None:
            raise SourceError(f"starting_offsets names no offsets for topic {topic!r}")
        for partition in partitions[topic]:
            if partition not in given:
                raise SourceError(f"starting_offsets for {topic!r} has no offset for partition {partition}")
            resolved[(topic, partition)] = int(given[partition])
    return resolved


# ---------------------------------------------------------------------------------------------
# Executor side: reading a range into Arrow batches
# ---------------------------------------------------------------------------------------------

_consumers: dict[str, Any] = {}


def _cached_consumer(options: SourceOptions):
    """One consumer per Python worker and configuration, reused across tasks."""
    key = json.dumps([options.client, options.read_committed], sort_keys=True)
    if key not in _consumers:
        _consumers[key] = consumer(
            options.client,
            **{
                "isolation.level": "read_committed" if options.read_committed else "read_uncommitted",
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
                **FETCH_TUNING,
            },
        )
    return _consumers[key]


def to_arrow(messages: list[Any], topic: str, partition: int):
    import pyarrow as pa

    n = len(messages)
    keys, values, offsets, stamps, headers = [], [], [], [], []
    for m in messages:
        keys.append(m.key())
        values.append(m.value())
        offsets.append(m.offset())
        stamps.append(m.timestamp()[1] * 1000)
        h = m.headers()
        headers.append([{"key": k, "value": v} for k, v in h] if h else [])
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(headers, HEADERS_TYPE()),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "headers"],
    )


def HEADERS_TYPE():
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def read_partition_range(options: SourceOptions, part: KafkaRange) -> Iterator[Any]:
    if options.failpoints:
        Failpoints(parse_failpoints(options.failpoints), options.failpoint_state, options.driver_pgid).hit(
            "source.read", slot=part.partition
        )
    reader = _cached_consumer(options)
    start = part.start
    try:
        pending: list[Any] = []
        for batch in read_range(reader, part.topic, part.partition, start, part.end):
            pending.extend(batch)
            if len(pending) >= ARROW_BATCH_ROWS:
                yield to_arrow(pending, part.topic, part.partition)
                pending = []
        if pending:
            yield to_arrow(pending, part.topic, part.partition)
    except RangeReadError as exc:
        if "out of range" in str(exc) and options.on_out_of_range == "earliest":
            low = start_offsets(admin_client(options.client), {part.topic: [part.partition]})
            first = low[(part.topic, part.partition)]
            if first > start:
                log.error(
                    "source %s: offsets [%d, %d) of %s/%d were deleted before they were read; "
                    "on_out_of_range=earliest continues from %d (records LOST)",
                    options.name, start, first, part.topic, part.partition, first,
                )  # fmt: skip
                yield from read_partition_range(options, KafkaRange(part.topic, part.partition, first, part.end))
                return
        raise SourceError(f"source {options.name}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Driver side: planning
# ---------------------------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._admin = None
        self._group_consumer = None
        self._available_now_target: planning.Offsets | None = None

    @property
    def admin(self):
        if self._admin is None:
            self._admin = admin_client(self.options.client)
        return self._admin

    def initialOffset(self) -> dict:
        return self.options.starting

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_epoch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def _latest(self) -> planning.Offsets:
        """Partitions and their latest offsets. A broker that restarts is waited for (bounded by
        broker_wait_s); a topic that no longer exists stops the pipeline."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.options.broker_wait_s
        while True:
            try:
                partitions = describe_partitions(self.admin, self.options.topics)
                return end_offsets(self.admin, partitions, read_committed=self.options.read_committed)
            except UnknownTopic as exc:
                raise SourceError(
                    f"source {self.options.name}: topic {exc.topic!r} does not exist (deleted, or never created); "
                    "the pipeline stops rather than silently skip or re-read it"
                ) from None
            except (BrokerUnreachable, KafkaException) as exc:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"source {self.options.name}: cannot reach Kafka at "
                        f"{self.options.client.get('bootstrap.servers')} for {self.options.broker_wait_s:.0f} s: {exc}"
                    ) from None
                log.warning("source %s: Kafka unreachable (%s); retrying", self.options.name, exc)
                time.sleep(1.0)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The epoch's end offsets. The two branches of a config source must plan the same epoch:
        Spark asks them one after the other, in an order of its own, and the second one adopts
        the plan the first made from the same start. (Capping one branch at the other's previous
        plan instead made it lag one epoch behind whenever Spark asked it first, and cost an
        extra epoch at the end.)"""
        if not self.options.plan_dir:
            return self._plan(start, limit)
        plans = PlanBook(Path(self.options.plan_dir), self.options.run_id)
        role = "follower" if self.options.follower else "leader"
        shared = plans.take(start, role)
        if shared is not None:
            return shared
        end = self._plan(start, limit)
        leader_end = plans.leader_end()
        if self.options.follower and leader_end is not None and start != leader_end:
            # Out of step with the view branch (never expected: both ends are logged together):
            # catch up, but never get ahead of it.
            end = planning.encode(planning.follow(planning.decode(start), planning.decode(end),
                                                  planning.decode(leader_end)))  # fmt: skip
        plans.offer(start, end, role)
        return end

    def _plan(self, start: dict, limit: ReadLimit) -> dict:
        begin = planning.decode(start)
        latest = self._available_now_target if self._available_now_target is not None else self._latest()
        if self._available_now_target is None:
            vanished = {tp for tp in begin if tp not in latest}
            if vanished:
                raise SourceError(
                    f"source {self.options.name}: partitions {sorted(vanished)} disappeared (topic deleted and "
                    "recreated?); refusing to continue"
                )
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = planning.plan_ends(begin, latest, max_records)
        # Never plan backwards: a recreated topic has a smaller end than what was read already.
        for tp, end in ends.items():
            if end < begin.get(tp, 0):
                raise SourceError(
                    f"source {self.options.name}: {tp[0]}/{tp[1]} ends at offset {end}, before offset "
                    f"{begin[tp]} already read (topic recreated?); refusing to continue"
                )
        return planning.encode(ends)

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        if not self.options.reads:
            return []
        ranges = planning.split_ranges(planning.decode(start), planning.decode(end), self.options.max_records_per_task)
        return [KafkaRange(r.topic, r.partition, r.start, r.end) for r in ranges]

    def read(self, partition: KafkaRange) -> Iterator[Any]:
        yield from read_partition_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Spark marked the epoch ending at `end` committed: publish progress for lag monitoring."""
        if not self.options.group_id or not self.options.reads:
            return
        from confluent_kafka import TopicPartition

        try:
            if self._group_consumer is None:
                self._group_consumer = consumer(self.options.client, **{"group.id": self.options.group_id})
            offsets = [TopicPartition(t, p, o) for (t, p), o in planning.decode(end).items()]
            if offsets:
                self._group_consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # monitoring only: never fail the pipeline for it
            log.warning("source %s: could not commit offsets to group %s: %s", self.options.name,
                        self.options.group_id, exc)  # fmt: skip

    def stop(self) -> None:
        if self._group_consumer is not None:
            self._group_consumer.close()
            self._group_consumer = None


class PlanBook:
    """The plan one branch of a config source made for an epoch, offered to the other branch
    (one small JSON file per run; both branches live in the driver and are asked in turn).
    Read once when opened: open one per latestOffset call."""

    def __init__(self, folder: Path, run_id: str):
        self.folder, self.path = folder, folder / f"{run_id}.json"
        try:
            self.book: dict = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.book = {}

    def _save(self) -> None:
        first = not self.path.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f".{os.getpid()}.tmp"
        staging.write_text(json.dumps(self.book, sort_keys=True))
        os.replace(staging, self.path)
        if first:  # a new run: earlier runs' files are never read again
            runs = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            for old in runs[:-8]:
                old.unlink(missing_ok=True)

    def offer(self, start: dict, end: dict, role: str) -> None:
        """Record `role`'s plan start -> end for the other branch to take once."""
        self.book.update(start=start, end=end, by=role, taken=False)
        if role == "leader":
            self.book["leader_end"] = end
        self._save()

    def take(self, start: dict, role: str) -> dict | None:
        """The other branch's untaken plan from the same start, marked taken; else None."""
        book = self.book
        if not book or book["taken"] or book["by"] == role or book["start"] != start:
            return None
        book["taken"] = True
        if role == "leader":
            book["leader_end"] = book["end"]
        self._save()
        return book["end"]

    def leader_end(self) -> dict | None:
        return self.book.get("leader_end")


class KafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return RAW_SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.from_json(self.options["eos.source"]))

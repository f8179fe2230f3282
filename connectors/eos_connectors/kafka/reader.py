"""The re-settable Kafka source as a PySpark Python streaming data source ("eos-kafka").

Driver side (in a Python process the Spark driver starts, so everything travels in the
`eos.source` option):
- `latestOffset` plans the epoch's end offset of every partition: at most
  `max_records_per_epoch` offsets, shared fairly by the partitions (water-filling: one hot
  partition cannot starve the others, nor be held back by them once they are drained), never
  beyond the last stable offset for read_committed. Spark logs the plan before any record is
  read: that log is the barrier, and a replay reads exactly the logged ranges.
- Every plan re-checks each topic's id: a topic deleted and recreated under the same name stops
  the pipeline (even when the new topic has more records than the old one).
- `partitions` cuts each partition's range into chunks of at most an even share of the epoch
  per task (and at most `max_records_per_task` offsets), so that one hot partition is still read
  by every task, and packs the chunks into `parallelism` read tasks (largest first onto the least
  loaded task): a deterministic function of the logged ranges. These tasks are the epoch's sink
  slots when the pipeline is stateless, so a replay gives every slot the same records.
Executor side:
- `read` reads its ranges with a cached read_committed consumer (ranges end at their planned end
  offset, never at "N records read": markers and aborted records leave offset gaps), decodes
  Avro keys and values right there with fastavro (no extra trip of the rows to a decoding UDF),
  and applies the poison policy: a record that cannot be decoded stops the epoch under `fail`,
  or carries its error and raw bytes under `skip` and `dlq`. A record whose schema id the
  registry definitively does not know is routed so only once the id is recorded as poison for
  the pipeline: until then the attempt fails asking the driver to record it (`PoisonDecision`,
  eos.protocol.poison), and each task reads the recorded ids from its job.
- After each epoch the end offsets are committed to a consumer group, for lag monitors only, on
  a thread of their own (eos_connectors.kafka.group_offsets).
"""

from __future__ import annotations

import base64
import logging
import os
import pickle
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from eos.api import (
    Failpoints,
    PoisonDecision,
    PoisonRecord,
    SharedEnds,
    SourceFailed,
    crossing,
    parse_failpoints,
    recorded_poison,
)
from eos_connectors.kafka import offsets as planning
from eos_connectors.kafka.clients import (
    BrokerUnreachable,
    UnknownTopic,
    admin_client,
    describe_topics,
    end_offsets,
    start_offsets,
)
from eos_connectors.kafka.group_offsets import GroupPublisher
from eos_connectors.kafka.range_reader import RangeReadError, range_consumer, read_range

log = logging.getLogger("eos.source")

FORMAT_NAME = "eos-kafka"
ARROW_BATCH_ROWS = 20_000
METADATA = (
    "topic string, partition int, offset long, timestamp timestamp, headers array<struct<key: string, value: binary>>"
)
POISON = "_eos_error string, _eos_raw_key binary, _eos_raw_value binary"


@dataclass(frozen=True)
class ReaderOptions:
    name: str
    client: dict[str, Any]  # librdkafka settings: bootstrap.servers, SASL/SSL, passthrough
    topics: list[str]
    starting: dict[str, dict[str, int]]  # resolved starting offsets, encoded
    topic_ids: dict[str, str]  # pinned: a different id behind a name is a recreated topic
    parallelism: int
    on_error: str
    key_codec: Any = None  # AvroCodec: decoded in the read task
    value_codec: Any = None
    max_records_per_epoch: int | None = None
    max_records_per_task: int = 200_000
    read_committed: bool = True
    on_out_of_range: str = "fail"
    group_id: str | None = None  # consumer group for lag monitoring
    broker_wait_s: float = 120.0  # how long planning retries an unreachable broker before failing
    failpoints: list[str] = field(default_factory=list)  # armed `source.*` specs (tests)
    failpoint_state: str = ""
    driver_pgid: int = 0
    poison_scan: bool = False  # the pipeline's second scan, for poison rows only (eos.protocol.source)
    shared_ends: SharedEnds | None = None  # where every scan of the source takes each epoch's ends

    def __repr__(self) -> str:  # the client settings with their secrets masked
        from eos.api import redacted  # here: the read side's processes load no pydantic

        return (
            f"ReaderOptions(name={self.name!r}, client={redacted(self.client)!r}, topics={self.topics!r}, "
            f"parallelism={self.parallelism!r}, on_error={self.on_error!r}, poison_scan={self.poison_scan!r})"
        )

    def failpoints_armed(self) -> Failpoints | None:
        return (
            Failpoints(parse_failpoints(self.failpoints), self.failpoint_state, self.driver_pgid)
            if self.failpoints
            else None
        )

    def encode(self) -> str:
        return base64.b64encode(pickle.dumps(self)).decode()

    @staticmethod
    def decode(text: str) -> ReaderOptions:
        return pickle.loads(base64.b64decode(text))

    def schema(self) -> str:
        key = self.key_codec.ddl if self.key_codec is not None else "binary"
        value = self.value_codec.ddl if self.value_codec is not None else "binary"
        return f"key {key}, value {value}, {METADATA}, {POISON}"


class KafkaRanges(InputPartition):
    """One read task: several planned ranges (topic, partition, start, end)."""

    def __init__(self, ranges: list[tuple[str, int, int, int]]):
        super().__init__(ranges)
        self.ranges = ranges


# ---------------------------------------------------------------------------------------------
# Executor side
# ---------------------------------------------------------------------------------------------

_consumers: dict[str, Any] = {}


def _cached_consumer(options: ReaderOptions) -> Any:
    """One consumer per Python worker and configuration, reused across tasks."""
    import json

    key = json.dumps([options.client, options.read_committed], sort_keys=True)
    if key not in _consumers:
        _consumers[key] = range_consumer(
            options.client, options.read_committed, **{"enable.partition.eof": True, "auto.offset.reset": "error"}
        )
    return _consumers[key]


def _headers_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def to_arrow(
    options: ReaderOptions, messages: list[Any], topic: str, partition: int, recorded: frozenset[str] = frozenset()
) -> Any:
    """Kafka messages -> one Arrow batch of the source's schema, decoded, poison marked.
    `recorded`: the source's recorded poison decisions (eos.protocol.poison)."""
    import pyarrow as pa

    n = len(messages)
    # One comprehension per column: a loop appending to five lists cost twice as much per record.
    keys = [m.key() for m in messages]
    values = [m.value() for m in messages]
    offsets = [m.offset() for m in messages]
    stamps = [m.timestamp()[1] * 1000 for m in messages]
    headers = [m.headers() for m in messages]
    key_array = pa.array(keys, pa.binary())
    value_array = pa.array(values, pa.binary())
    errors: list[str | None] = [None] * n
    decoded_key, decoded_value = key_array, value_array
    for which, codec, raw in (("key", options.key_codec, key_array), ("value", options.value_codec, value_array)):
        if codec is None:
            continue
        from eos_connectors.formats.avro import UnknownSchemaIds, decode_batch
        from eos_connectors.formats.registry import poison_ids

        ids = poison_ids(recorded, codec.registry.location) if recorded and codec.registry else frozenset()
        try:
            result = decode_batch(codec, raw, ids)
        except UnknownSchemaIds as unknown:
            raise _unknown_ids(options, unknown, f"{topic}/{partition} offset {offsets[unknown.first]}") from None
        problems = result.field("error")
        if problems.null_count < n:
            for i, problem in enumerate(problems.to_pylist()):
                if problem is not None and errors[i] is None:
                    errors[i] = problem
        if which == "key":
            decoded_key = result.field("value")
        else:
            decoded_value = result.field("value")
    raw_key = raw_value = pa.nulls(n, pa.binary())
    if any(e is not None for e in errors):
        bad = [i for i, e in enumerate(errors) if e is not None]
        if options.on_error == "fail":
            i = bad[0]
            raise PoisonRecord(
                f"source {options.name}: cannot decode the record at {topic}/{partition} offset {offsets[i]}: "
                f"{errors[i]} (on_error: fail; use on_error: skip or dlq to route such records instead)"
            )
        mask = pa.array([e is not None for e in errors])
        raw_key = pa.array([k if e is not None else None for k, e in zip(keys, errors, strict=True)], pa.binary())
        raw_value = pa.array([v if e is not None else None for v, e in zip(values, errors, strict=True)], pa.binary())
        decoded_key = _null_where(decoded_key, mask)
        decoded_value = _null_where(decoded_value, mask)
    return pa.RecordBatch.from_arrays(
        [
            decoded_key,
            decoded_value,
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            _headers_array(headers),
            pa.array(errors, pa.string()),
            raw_key,
            raw_value,
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "headers", *POISON_NAMES],
    )


POISON_NAMES = ("_eos_error", "_eos_raw_key", "_eos_raw_value")


def _unknown_ids(options: ReaderOptions, unknown: Any, where: str) -> Exception:
    """Schema ids the registry definitively lacks, met for the first time: under `fail` a stop;
    under `skip` and `dlq` a request to record them as poison, after which every attempt routes
    their records as poison (a record is never routed by an answer that is not recorded)."""
    if options.on_error == "fail":
        return PoisonRecord(
            f"source {options.name}: cannot decode the record at {where}: {unknown.message} (on_error: fail)",
            hint="to route such records as poison instead, set on_error: dlq (or skip); eos then records each "
            "such schema id in the checkpoint and routes its records the same way in every replay",
        )
    return PoisonDecision(
        f"source {options.name}: the record at {where}: {unknown.message}; the ids are recorded as poison for "
        f"this pipeline and the epoch is retried (on_error: {options.on_error})",
        source=options.name,
        decisions=unknown.decisions,
    )


def _headers_array(headers: list[Any]) -> Any:
    """Kafka headers ([(key, value)] or None per message) -> list<struct<key, value>>."""
    import pyarrow as pa

    if not any(headers):  # the common case: no message has headers
        return pa.array([[]] * len(headers), _headers_type())
    return pa.array([[{"key": k, "value": v} for k, v in h] if h else [] for h in headers], _headers_type())


def _null_where(array: Any, mask: Any) -> Any:
    import pyarrow.compute as pc

    return pc.if_else(mask, None, array)


def read_ranges(options: ReaderOptions, ranges: list[tuple[str, int, int, int]]) -> Iterator[Any]:
    armed = options.failpoints_armed()
    if armed is not None:
        armed.hit("source.read", slot=ranges[0][1] if ranges else None)
    reader = _cached_consumer(options)
    recorded = recorded_poison(options.name) if options.key_codec or options.value_codec else frozenset()
    for topic, partition, start, end in ranges:
        yield from _read_one(options, reader, topic, partition, start, end, recorded)


def _read_one(
    options: ReaderOptions,
    reader: Any,
    topic: str,
    partition: int,
    start: int,
    end: int,
    recorded: frozenset[str] = frozenset(),
) -> Iterator[Any]:
    try:
        pending: list[Any] = []
        for batch in read_range(reader, topic, partition, start, end):
            pending.extend(batch)
            if len(pending) >= ARROW_BATCH_ROWS:
                yield to_arrow(options, pending, topic, partition, recorded)
                pending = []
        if pending:
            yield to_arrow(options, pending, topic, partition, recorded)
    except RangeReadError as exc:
        if "out of range" in str(exc) and options.on_out_of_range == "earliest":
            first = start_offsets(admin_client(options.client), {topic: [partition]})[(topic, partition)]
            if first > start:
                log.error(
                    "source %s: offsets [%d, %d) of %s/%d were deleted before they were read; "
                    "on_out_of_range=earliest continues from %d (records LOST)",
                    options.name, start, first, topic, partition, first,
                )  # fmt: skip
                yield from _read_one(options, reader, topic, partition, first, end, recorded)
                return
        raise SourceFailed(f"source {options.name}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Driver side: planning
# ---------------------------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReaderOptions):
        self.options = options
        self._admin: Any = None
        self._group: GroupPublisher | None = None
        self._available_now = False
        self._available_now_target: planning.Offsets | None = None
        self._rounds = 0  # Spark's planning rounds this scan was asked in (eos.protocol.barrier)
        self._latest_seen: planning.Offsets = {}  # latest offsets a check of taken ends last asked for

    @property
    def admin(self) -> Any:
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
        broker_wait_s); a topic that no longer exists, or was recreated, stops the pipeline."""
        from confluent_kafka import KafkaException

        name = self.options.name
        deadline = time.monotonic() + self.options.broker_wait_s
        while True:
            try:
                topics = describe_topics(self.admin, self.options.topics)
                break
            except UnknownTopic as exc:
                raise SourceFailed(
                    f"source {name}: topic {exc.topic!r} does not exist (deleted, or never created); the pipeline "
                    "stops rather than silently skip or re-read it"
                ) from None
            except (BrokerUnreachable, KafkaException) as exc:
                if time.monotonic() > deadline:
                    raise SourceFailed(
                        f"source {name}: cannot reach Kafka at {self.options.client.get('bootstrap.servers')} for "
                        f"{self.options.broker_wait_s:.0f} s: {exc}"
                    ) from None
                log.warning("source %s: Kafka unreachable (%s); retrying", name, exc)
                time.sleep(1.0)
        for topic, info in topics.items():
            pinned = self.options.topic_ids.get(topic)
            if pinned and info.topic_id != pinned:
                raise SourceFailed(
                    f"source {name}: topic {topic!r} was deleted and recreated while the pipeline ran (topic id "
                    f"{pinned} when the checkpoint was created, {info.topic_id} now); its offsets mean other records "
                    "now, so the pipeline stops instead of skipping or re-reading any",
                    hint="to read the new topic from its start, `eos reset PIPELINE --yes` (output is written again)",
                )
        partitions = {topic: info.partitions for topic, info in topics.items()}
        return end_offsets(self.admin, partitions, read_committed=self.options.read_committed)

    def prepareForTriggerAvailableNow(self) -> None:
        # The target is taken at this scan's first plan of its own, right after this: a scan that
        # takes another scan's ends (eos.protocol.barrier) never needs one (it checks them against
        # the log's latest offsets instead).
        self._available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        with crossing():
            self._rounds += 1
            if self.options.shared_ends is None:
                return self._plan(start, limit)
            return self.options.shared_ends.agree(
                self._rounds, start, lambda: self._plan(start, limit), lambda ends: self._check_taken(start, ends)
            )

    def _check_taken(self, start: dict, taken: Any) -> None:
        """Ends another scan published (eos.protocol.barrier) are read back from a file: they are
        used only if every partition of the start has one, and start <= end <= the latest offset.
        The latest offsets are asked for only when an end passes those asked for before (a log
        only grows; the scan that plans stops at a recreated topic), and of the start's partitions
        only, in one request (a new partition takes the plan's full look at the topics)."""
        try:
            begin, ends = planning.decode(start), planning.decode(taken)
        except (AttributeError, TypeError, ValueError):
            self._refuse_taken([f"unreadable: {str(taken)[:100]}"])
        if any(end > self._latest_seen.get(tp, -1) for tp, end in ends.items()):
            if begin and set(ends) <= set(begin):
                partitions: dict[str, list[int]] = {}
                for topic, partition in begin:
                    partitions.setdefault(topic, []).append(partition)
                latest = end_offsets(self.admin, partitions, read_committed=self.options.read_committed)
                self._latest_seen = {**self._latest_seen, **latest}
            else:
                self._latest_seen = self._latest()
        wrong = [f"{t}/{p} has no end" for t, p in sorted(set(begin) - set(ends))]
        for (topic, partition), end in sorted(ends.items()):
            low, high = begin.get((topic, partition), 0), self._latest_seen.get((topic, partition))
            if high is None or not low <= end <= high:
                wrong.append(f"{topic}/{partition} ends at {end}, outside [{low}, {high}] (start, latest offset)")
        if wrong:
            self._refuse_taken(wrong)

    def _refuse_taken(self, wrong: list[str]) -> NoReturn:
        where = self.options.shared_ends.folder if self.options.shared_ends else "?"
        raise SourceFailed(
            f"source {self.options.name}: the end offsets another scan published for this epoch in {where} cannot be "
            f"right ({'; '.join(wrong)}); refusing them rather than read records twice or skip them",
            hint=f"someone else may have written into eos's scratch folder: stop the pipeline, remove {where}, and "
            "start it again",
        )

    def _plan(self, start: dict, limit: ReadLimit) -> dict:
        begin = planning.decode(start)
        if self._available_now:
            if self._available_now_target is None:
                self._available_now_target = self._latest()
            latest = self._available_now_target
        else:
            latest = self._latest()
            vanished = {tp for tp in begin if tp not in latest}
            if vanished:
                raise SourceFailed(
                    f"source {self.options.name}: partitions {sorted(vanished)} disappeared (topic deleted and "
                    "recreated?); refusing to continue"
                )
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = planning.plan_ends(begin, latest, max_records)
        for tp, end in ends.items():  # never plan backwards (a recreated topic ends sooner)
            if end < begin.get(tp, 0):
                raise SourceFailed(
                    f"source {self.options.name}: {tp[0]}/{tp[1]} ends at offset {end}, before offset {begin[tp]} "
                    "already read (topic recreated?); refusing to continue"
                )
        armed = self.options.failpoints_armed()
        if armed is not None:
            armed.hit("source.plan")
        return planning.encode(ends)

    def partitions(self, start: dict, end: dict) -> list[KafkaRanges]:
        if self.options.poison_scan and self.options.on_error == "fail":
            return []  # under `fail` the main scan stops at the first poison record: nothing to read
        begin, ends = planning.decode(start), planning.decode(end)
        size = planning.chunk_size(begin, ends, self.options.parallelism, self.options.max_records_per_task)
        packed = planning.pack(planning.split_ranges(begin, ends, size), self.options.parallelism)
        return [KafkaRanges([(r.topic, r.partition, r.start, r.end) for r in task]) for task in packed]

    def read(self, partition: KafkaRanges) -> Iterator[Any]:
        with crossing():
            yield from read_ranges(self.options, partition.ranges)

    def commit(self, end: dict) -> None:
        """Spark marked the epoch ending at `end` committed: publish progress for lag monitoring."""
        if self.options.group_id and not self.options.poison_scan:
            if self._group is None:
                self._group = GroupPublisher(self.options.client, self.options.group_id, self.options.name)
            self._group.publish(planning.decode(end))

    def stop(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None
        if jvm_went_away(sys.exc_info()[1]):
            # PySpark's source runner calls this when its loop ends. On end-of-stream the JVM has
            # stopped the query and closed the connection; the runner would then report the
            # EOFError back over that closed connection and print the BrokenPipeError's traceback
            # on the user's terminal at every stop. Nobody is listening: end the process quietly.
            os._exit(0)


def jvm_went_away(error: BaseException | None) -> bool:
    """Whether `error` is the end-of-stream PySpark's source runner reads when the JVM closes its
    connection (raised by pyspark.serializers.read_int), not an EOFError from eos's own code, which
    must reach Spark as the epoch's error."""
    if not isinstance(error, EOFError) or error.__traceback__ is None:
        return False
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    code = frame.tb_frame.f_code
    return code.co_name == "read_int" and Path(code.co_filename).parent.name == "pyspark"


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return ReaderOptions.decode(self.options["eos.source"]).schema()

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(ReaderOptions.decode(self.options["eos.source"]))

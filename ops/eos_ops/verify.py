"""`eos verify`: check an exactly-once claim on real topics and tables.

It reads the input and the committed output (read_committed; or a PostgreSQL table, with a plain
query) with its own plain-Python decoders (no Spark, no eos connector code: the check must not
share a code path with what it checks) and compares them under one relation:

- match: every input record has exactly one output record with the same id (identity or a keyed
  mapping: ids are a field of the record, the key, or the whole value, optionally extracted from
  the output with a regex);
- aggregate: totals recomputed from the input (optionally deduplicated and filtered), grouped by
  fields and event-time windows, equal the output's records, each group present exactly once.

It reports lost, duplicated and unexpected records (and wrong totals) with examples, and what a
read_uncommitted reader sees beyond the committed output: the aborted records that show faults
really happened. A table has no read_uncommitted view; for a table it reports instead how many
prepared transactions wait in its database (rows nobody can see until they are resolved).
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from eos.config import parse_duration
from eos.errors import ConfigError, EnvironmentProblem
from eos_ops.verify_compare import Tolerance, equal

# librdkafka's own log lines (config warnings, retries) go to this logger, never raw to stderr.
log = logging.getLogger("eos.kafka.verify")
log.addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


Client = str | Mapping[str, Any]


def client_settings(client: Client) -> dict[str, Any]:
    """A bootstrap string, or a whole client config (bootstrap.servers plus SASL/SSL settings...)."""
    return {"bootstrap.servers": client} if isinstance(client, str) else dict(client)


def _client(kind: Any, settings: dict[str, Any]) -> Any:
    """A confluent-kafka client; settings librdkafka refuses are the user's config error."""
    from confluent_kafka import KafkaException

    try:
        return kind(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(f"Kafka client settings for {settings.get('bootstrap.servers')}: {exc}") from None


def topic_ends(client: Client, topic: str, read_committed: bool = True) -> dict[int, tuple[int, int]]:
    """(log start, end) of every partition of `topic`: the end is the last stable offset for
    read_committed (aborted records and open transactions are invisible), else the high
    watermark."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = _client(AdminClient, {**client_settings(client), "logger": log})
    try:
        metadata = admin.list_topics(topic=topic, timeout=15)
    except KafkaException as exc:
        raise EnvironmentProblem(f"Kafka: cannot read the metadata of topic {topic!r}: {exc}") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        error = f" ({info.error})" if info is not None and info.error is not None else ""
        raise ConfigError(f"topic {topic!r} does not exist or cannot be described{error}")
    partitions = sorted(info.partitions)
    level = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    found: dict[int, list[int]] = {p: [0, 0] for p in partitions}
    for index, spec in ((0, OffsetSpec.earliest()), (1, OffsetSpec.latest())):
        request = {TopicPartition(topic, p): spec for p in partitions}
        deadline = time.monotonic() + 30
        while True:  # a topic created a moment ago may not have a leader yet
            try:
                answers = admin.list_offsets(request, isolation_level=level, request_timeout=15)
                for tp, future in answers.items():
                    found[tp.partition][index] = future.result().offset
                break
            except KafkaException as exc:
                if time.monotonic() > deadline or not exc.args[0].retriable():
                    raise EnvironmentProblem(f"Kafka: cannot list the offsets of topic {topic!r}: {exc}") from None
                time.sleep(0.2)
    return {p: (start, end) for p, (start, end) in found.items()}


def read_topic(
    client: Client,
    topic: str,
    read_committed: bool = True,
    start: Mapping[int, int] | None = None,
    end: Mapping[int, int] | None = None,
    stall_timeout_s: float = 60.0,
) -> list[Record]:
    """Every record of `topic` from `start` (default: the log start) to `end` (default: its
    current end, see topic_ends), in partition and offset order, read by a plain assigned
    consumer (no group is joined or committed to): eos's source shares none of this code."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ranges = {}
    for partition, (first, last) in topic_ends(client, topic, read_committed).items():
        begin = max(first, (start or {}).get(partition, first))
        stop = min(last, (end or {}).get(partition, last))
        if stop > begin:
            ranges[partition] = (begin, stop)
    if not ranges:
        return []
    settings = client_settings(client)
    consumer = _client(Consumer, {
        **settings,
        "group.id": settings.get("group.id", "eos-verify"),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        "enable.partition.eof": False,
        "logger": log,
    })  # fmt: skip
    found: dict[int, list[Record]] = {p: [] for p in ranges}
    try:
        consumer.incremental_assign([TopicPartition(topic, p, begin) for p, (begin, _) in ranges.items()])
        open_ranges = dict(ranges)
        progress = time.monotonic()
        while open_ranges:
            for message in consumer.consume(1000, 0.1):
                error = message.error()
                if error is not None:
                    if error.fatal() or (not error.retriable() and error.code() != KafkaError._PARTITION_EOF):
                        raise EnvironmentProblem(f"Kafka: reading {topic}/{message.partition()} failed: {error}")
                    continue
                partition, offset = message.partition(), message.offset()
                if partition in open_ranges and offset < open_ranges[partition][1]:
                    found[partition].append(Record(
                        topic, partition, offset, message.key(), message.value(), tuple(message.headers() or ()),
                        message.timestamp()[1],
                    ))  # fmt: skip
                    progress = time.monotonic()
            # Markers and aborted records take offsets a read_committed reader never receives:
            # a range is read when the position reaches its end, not when its last record came.
            positions = consumer.position([TopicPartition(topic, p) for p in open_ranges])
            for tp in positions:
                if tp.offset >= open_ranges[tp.partition][1]:
                    del open_ranges[tp.partition]
                    consumer.incremental_unassign([TopicPartition(topic, tp.partition)])
                    progress = time.monotonic()
            if time.monotonic() - progress > stall_timeout_s:
                raise EnvironmentProblem(
                    f"Kafka: no progress reading {topic} partitions {sorted(open_ranges)} for {stall_timeout_s:.0f} s"
                )
    finally:
        consumer.close()
    return [record for partition in sorted(found) for record in found[partition]]


@dataclass(frozen=True)
class Row:
    """One row of an output table (its fields are its columns)."""

    table: str
    index: int


def read_table(dsn: str, table: str, where: str | None = None) -> list[tuple[Row, dict[str, Any]]]:
    """Every committed row of `table` (optionally schema-qualified) as a dict, by a plain query."""
    import psycopg
    from psycopg import sql

    query = sql.SQL("SELECT * FROM {}").format(sql.Identifier(*table.split(".")))
    if where:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(where))
    try:
        with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row, connect_timeout=15) as conn:
            rows = conn.execute(query).fetchall()
    except psycopg.errors.UndefinedTable:
        raise ConfigError(f"PostgreSQL: table {table!r} does not exist") from None
    except psycopg.Error as exc:  # its message never holds the DSN's password
        raise EnvironmentProblem(f"PostgreSQL: reading table {table!r} failed: {str(exc).strip()}") from None
    return [(Row(table, i), row) for i, row in enumerate(rows)]


def prepared_transactions(dsn: str) -> int:
    """Prepared transactions waiting in the database of `dsn`."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=15) as conn:
            query = "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            return int(conn.execute(query).fetchone()[0])
    except psycopg.Error as exc:
        raise EnvironmentProblem(f"PostgreSQL: counting prepared transactions failed: {str(exc).strip()}") from None


# ---------------------------------------------------------------------------------------------
# Decoding, independently of the pipeline's codecs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoder:
    format: str = "string"  # raw | string | json | avro
    schema: str | None = None  # .avsc path (avro)
    wire: bool = False  # avro with Schema Registry framing: magic byte 0 + 4-byte schema id

    def decode(self, value: bytes | None) -> Any:
        if value is None:
            return None
        if self.format == "raw":
            return value
        if self.format == "string":
            return value.decode("utf-8", errors="replace")
        if self.format == "json":
            return json.loads(value)
        if self.format == "avro":
            import fastavro

            body = value[5:] if self.wire else value
            return fastavro.schemaless_reader(io.BytesIO(body), self._parsed_schema())
        raise ConfigError(f"unknown format {self.format!r} (raw, string, json, avro)")

    def _parsed_schema(self) -> Any:
        cached = _schemas.get(self.schema or "")
        if cached is None:
            import fastavro

            from eos_ops.verify_decode import load_avsc

            if not self.schema:
                raise ConfigError("format avro needs a schema (.avsc)")
            cached = fastavro.parse_schema(load_avsc(self.schema, None))
            _schemas[self.schema] = cached
        return cached


_schemas: dict[str, Any] = {}


def _field(decoded: Any, record: Record | Row, path: str) -> Any:
    """A record's id or group field: 'key', 'value', or a (dotted) field of the decoded value; a
    table row's column."""
    if isinstance(record, Row):
        return decoded.get(path, _MISSING)
    if path == "key":
        return record.key.decode("utf-8", errors="replace") if record.key is not None else None
    if path == "value":
        return decoded
    current = decoded
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return _MISSING
        current = current[part]
    return current


_MISSING = object()


def to_millis(value: Any) -> int:
    """Event times as epoch milliseconds: datetime, ISO-8601 string, or a number of ms."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    return int(value)


# ---------------------------------------------------------------------------------------------
# Relations
# ---------------------------------------------------------------------------------------------


@dataclass
class Match:
    input_id: str = "value"
    output_id: str = "value"
    output_id_regex: str | None = None  # group 1 (or the whole match) of the output id is the input id


@dataclass
class Aggregate:
    group_by: dict[str, Any]  # output field -> input field, or {"field": f, "window": "1m"}
    values: dict[str, Any]  # output field -> "count" | {"count_where": {f: v}} | {"sum": f}
    dedupe_by: str | None = None
    where: dict[str, list[Any]] = field(default_factory=dict)
    # Append-mode windows are emitted once the watermark (max event time - delay) passes their
    # end: with a delay, only windows the input's final watermark has closed are expected.
    watermark_delay: str | None = None


@dataclass
class VerifySpec:
    bootstrap: str
    input_topic: str
    output_topic: str = ""
    input_decoder: Decoder = field(default_factory=Decoder)
    output_decoder: Decoder = field(default_factory=Decoder)
    match: Match | None = None
    aggregate: Aggregate | None = None
    output_table: str | None = None  # a PostgreSQL table instead of an output topic
    dsn: str | None = None  # the table's database (libpq string; PG* environment variables apply too)
    where: str | None = None  # an SQL condition on the table's rows (e.g. one pipeline's share of a table)
    client: dict[str, Any] = field(default_factory=dict)  # librdkafka settings beyond bootstrap.servers (SASL, SSL)
    tolerance: Tolerance = field(default_factory=Tolerance)

    @property
    def kafka(self) -> dict[str, Any]:
        """Every Kafka client's settings: the spec's `config:` with its bootstrap servers."""
        return {**self.client, "bootstrap.servers": self.bootstrap}

    @property
    def output(self) -> str:
        return f"table {self.output_table}" if self.output_table else self.output_topic


@dataclass
class VerifyReport:
    relation: str
    input_records: int
    output_records: int
    output_uncommitted: int
    expected: int
    lost: list[Any]
    duplicated: list[Any]
    unexpected: list[Any]
    wrong: list[tuple[Any, Any, Any]] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    prepared: int | None = None  # a table's database: prepared transactions not yet resolved

    @property
    def aborted_seen(self) -> int:
        return self.output_uncommitted - self.output_records

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.wrong or self.undecodable)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "relation": self.relation, "input_records": self.input_records,
            "output_records": self.output_records, "read_uncommitted_records": self.output_uncommitted,
            "aborted_records_seen": self.aborted_seen, "expected": self.expected,
            "lost": len(self.lost), "duplicated": len(self.duplicated), "unexpected": len(self.unexpected),
            "wrong": len(self.wrong), "undecodable": len(self.undecodable),
            "examples": {"lost": _examples(self.lost), "duplicated": _examples(self.duplicated),
                         "unexpected": _examples(self.unexpected), "wrong": _examples(self.wrong),
                         "undecodable": self.undecodable[:5]},
            **({} if self.prepared is None else {"prepared_transactions": self.prepared}),
        }  # fmt: skip

    def lines(self) -> Iterable[str]:
        yield f"relation: {self.relation}"
        if self.prepared is not None:
            yield (
                f"input: {self.input_records} records (read_committed); output: {self.output_records} committed rows "
                f"({self.prepared} prepared transactions waiting in the database"
                f"{': their rows are invisible until they are resolved' if self.prepared else ''})"
            )
        else:
            yield (
                f"input: {self.input_records} records (read_committed); output: {self.output_records} committed, "
                f"{self.output_uncommitted} seen by read_uncommitted ({self.aborted_seen} aborted records: "
                f"{'faults happened and were rolled back' if self.aborted_seen else 'no aborted transactions'})"
            )
        yield (
            f"expected {self.expected}: lost {len(self.lost)}, duplicated {len(self.duplicated)}, unexpected "
            f"{len(self.unexpected)}" + (f", wrong totals {len(self.wrong)}" if self.wrong is not None else "")
        )
        problems = {"lost": self.lost, "duplicated": self.duplicated, "unexpected": self.unexpected,
                    "wrong (key, seen, expected)": self.wrong, "undecodable": self.undecodable}  # fmt: skip
        for label, items in problems.items():
            if items:
                yield f"  {label}, e.g.: {_examples(items)}"
        yield "result: EXACTLY ONCE" if self.ok else "result: FAILED"


def _examples(items: list[Any]) -> list[str]:
    return [str(item)[:200] for item in items[:5]]


def _decode_all(records: list[Record], decoder: Decoder, undecodable: list[str]) -> list[tuple[Record, Any]]:
    out = []
    for record in records:
        try:
            out.append((record, decoder.decode(record.value)))
        except Exception as exc:
            undecodable.append(f"{record.topic}/{record.partition}@{record.offset}: {exc}")
    return out


def _check_match(spec: VerifySpec, inputs, outputs, report: VerifyReport) -> None:
    match = spec.match or Match()
    regex = re.compile(match.output_id_regex) if match.output_id_regex else None
    expected: Counter[Any] = Counter(_field(d, r, match.input_id) for r, d in inputs)
    seen: Counter[Any] = Counter()
    for record, decoded in outputs:
        identity = _field(decoded, record, match.output_id)
        if regex is not None and isinstance(identity, str):
            found = regex.search(identity)
            identity = (found.group(1) if found.groups() else found.group(0)) if found else identity
        seen[identity] += 1
    report.expected = sum(expected.values())
    report.lost = sorted((expected - seen).elements(), key=str)
    report.duplicated = sorted(k for k in seen if k in expected and seen[k] > expected[k])
    report.unexpected = sorted((k for k in seen if k not in expected), key=str)


def _group_key(decoded: Any, record: Record, group_by: dict[str, Any]) -> tuple[Any, ...]:
    key = []
    for spec in group_by.values():
        if isinstance(spec, dict):
            value = to_millis(_field(decoded, record, spec["field"]))
            if "window" in spec:
                size = int(parse_duration(spec["window"]) * 1000)
                value -= value % size
            key.append(value)
        else:
            key.append(_field(decoded, record, spec))
    return tuple(key)


def _output_key(decoded: Any, record: Record, group_by: dict[str, Any]) -> tuple[Any, ...]:
    key = []
    for name, spec in group_by.items():
        value = _field(decoded, record, name)
        key.append(to_millis(value) if isinstance(spec, dict) else value)
    return tuple(key)


def _closed_windows(totals: dict[tuple[Any, ...], Any], agg: Aggregate, inputs) -> dict[tuple[Any, ...], Any]:
    """The groups whose window the final watermark (max event time of the input - delay) has
    passed: the only ones an append-mode windowed aggregate has emitted."""
    windows = [(i, s) for i, s in enumerate(agg.group_by.values()) if isinstance(s, dict) and "window" in s]
    if not windows or not inputs:
        raise ConfigError("watermark_delay needs a group_by field with a window")
    position, window = windows[0]
    watermark = max(to_millis(_field(d, r, window["field"])) for r, d in inputs)
    watermark -= int(parse_duration(agg.watermark_delay or 0) * 1000)
    size = int(parse_duration(window["window"]) * 1000)
    return {key: value for key, value in totals.items() if key[position] + size <= watermark}


def _check_aggregate(spec: VerifySpec, inputs, outputs, report: VerifyReport) -> None:
    agg = spec.aggregate
    assert agg is not None
    seen_ids: set[Any] = set()
    totals: dict[tuple[Any, ...], Counter[str]] = {}
    for record, decoded in inputs:
        if agg.dedupe_by:
            identity = _field(decoded, record, agg.dedupe_by)
            if identity in seen_ids:
                continue
            seen_ids.add(identity)
        if any(_field(decoded, record, f) not in allowed for f, allowed in agg.where.items()):
            continue
        group = totals.setdefault(_group_key(decoded, record, agg.group_by), Counter())
        for name, how in agg.values.items():
            if how == "count":
                group[name] += 1
            elif "count_where" in how:
                group[name] += all(_field(decoded, record, f) == v for f, v in how["count_where"].items())
            elif "sum" in how:
                group[name] += _field(decoded, record, how["sum"]) or 0
            else:
                raise ConfigError(f"aggregate value {name}: expected count, count_where or sum, got {how!r}")
    if agg.watermark_delay is not None:
        totals = _closed_windows(totals, agg, inputs)
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    duplicated = []
    for record, decoded in outputs:
        key = _output_key(decoded, record, agg.group_by)
        if key in seen:
            duplicated.append(key)
        seen[key] = {name: _field(decoded, record, name) for name in agg.values}
    report.expected = len(totals)
    report.lost = sorted(set(totals) - set(seen), key=str)
    report.duplicated = duplicated
    report.unexpected = sorted(set(seen) - set(totals), key=str)
    report.wrong = [
        (key, seen[key], {n: totals[key][n] for n in agg.values})
        for key in sorted(set(seen) & set(totals), key=str)
        if not all(equal(seen[key][n], totals[key][n], spec.tolerance) for n in agg.values)
    ]


def verify(spec: VerifySpec) -> VerifyReport:
    if (spec.match is None) == (spec.aggregate is None):
        raise ConfigError("say what to check: a match (ids) or an aggregate (totals), not both")
    if bool(spec.output_table) == bool(spec.output_topic):
        raise ConfigError("say where the output is: an output topic or an output table, not both")
    if spec.output_table and not spec.dsn:
        raise ConfigError("an output table needs the dsn of its database")
    inputs_raw = read_topic(spec.kafka, spec.input_topic, read_committed=True)
    relation = (
        f"match {spec.match.input_id} -> {spec.match.output_id}" if spec.match
        else f"aggregate by {', '.join(spec.aggregate.group_by)}"  # type: ignore[union-attr]
    )  # fmt: skip
    if spec.output_table:
        assert spec.dsn is not None
        outputs: list[tuple[Any, Any]] = read_table(spec.dsn, spec.output_table, spec.where)  # type: ignore[assignment]
        report = VerifyReport(relation, len(inputs_raw), len(outputs), len(outputs), 0, [], [], [])
        report.prepared = prepared_transactions(spec.dsn)
    else:
        outputs_raw = read_topic(spec.kafka, spec.output_topic, read_committed=True)
        uncommitted = len(read_topic(spec.kafka, spec.output_topic, read_committed=False))
        report = VerifyReport(relation, len(inputs_raw), len(outputs_raw), uncommitted, 0, [], [], [])
        outputs = _decode_all(outputs_raw, spec.output_decoder, report.undecodable)
    inputs = _decode_all(inputs_raw, spec.input_decoder, report.undecodable)
    if spec.match is not None:
        _check_match(spec, inputs, outputs, report)
    else:
        _check_aggregate(spec, inputs, outputs, report)
    return report


SPEC_FIELDS = ("bootstrap", "config", "input", "output", "match", "aggregate", "tolerance")


def load_spec(
    path: str | Path, bootstrap: str | None = None, dsn: str | None = None, tolerance: Tolerance | None = None
) -> VerifySpec:
    """A verify spec file (YAML; docs/VERIFY.md): bootstrap and config (librdkafka settings, e.g.
    SASL/SSL), input {topic, format, schema, wire}, output {topic, format, schema, wire} or
    {table, dsn, where} (a PostgreSQL table), `match: {input_id, output_id, output_id_regex}` or
    `aggregate: {...}`, and tolerance {rel, abs}. `${VAR}` takes secrets from the environment."""
    import difflib

    from eos.yamlsource import load_yaml

    data = load_yaml(path).data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a verify spec is a mapping ({', '.join(SPEC_FIELDS)})")
    for name in data:
        if name not in SPEC_FIELDS:
            close = difflib.get_close_matches(str(name), SPEC_FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known fields: {', '.join(SPEC_FIELDS)})"
            raise ConfigError(f"{path}: unknown field {name!r}{hint}")
    try:
        side = {k: data[k] for k in ("input", "output")}
        table_keys = ("table", "dsn", "where")
        return VerifySpec(
            bootstrap=bootstrap or data["bootstrap"],
            input_topic=side["input"]["topic"],
            output_topic=side["output"].get("topic", ""),
            input_decoder=Decoder(**{k: v for k, v in side["input"].items() if k != "topic"}),
            output_decoder=Decoder(**{k: v for k, v in side["output"].items() if k not in ("topic", *table_keys)}),
            match=Match(**data["match"]) if "match" in data else None,
            aggregate=Aggregate(**data["aggregate"]) if "aggregate" in data else None,
            output_table=side["output"].get("table"),
            dsn=dsn or side["output"].get("dsn"),
            where=side["output"].get("where"),
            client={str(k): v for k, v in (data.get("config") or {}).items()},
            tolerance=tolerance or Tolerance(**(data.get("tolerance") or {})),
        )
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: invalid verify spec: {exc}") from exc

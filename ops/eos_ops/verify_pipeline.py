"""`eos verify PIPELINE.yaml`: every sink and dead-letter queue of a pipeline, checked against its input.

1. The pipeline file says what to expect (eos.config.load_pipeline: the user's declaration, not
   eos's code path): the sources' topics, formats, `on_error` and DLQ topics, the transforms, the
   sinks with their keys, formats and modes, the output mode and the watermarks. Every Kafka
   client is made with the entry's own settings (`bootstrap` + `config:`, SASL/SSL included);
   PostgreSQL is read with the sink's DSN, a Delta table with the sink's storage options.
2. The checkpoint, when there is one, says where the run started (each source's pinned starting
   offsets) and how far it got: Spark's offset log holds each epoch's end offsets and
   watermark. Input past the last committed epoch is not expected yet.
3. Each source's records in that range are read by verify's own reader and decoders
   (eos_ops.verify, eos_ops.verify_decode). A record they reject is poison: it is expected in the
   source's DLQ exactly once (on_error: dlq), nowhere (skip), or stops the check (fail).
4. The pipeline's transforms run as a batch Spark query (local[2]) over the decoded rows: each
   sink's expected rows. Spark's batch engine shares nothing with eos's streaming exactly-once
   machinery (sources, epochs, transactions, sinks).
5. Each sink's committed output (read_committed, a plain SQL query, or a Delta table's latest
   version as delta-rs reads it) is compared with them
   under the sink's semantics (eos_ops.verify_checks).

Where batch and streaming differ, the difference is handled or reported: windows no watermark
has closed yet (append mode) are "still open", not lost; records the watermark dropped as late
(counted by the batch query) explain the rows they change; duplicates that
`dropDuplicatesWithinWatermark` let through after their state expired, and outer joins' unmatched
rows, are not modelled (a note says so). docs/VERIFY.md has the details and the limits.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eos.config import PipelineConfig, load_pipeline
from eos.errors import CheckpointError, ConfigError, EnvironmentProblem, EosError
from eos_ops.verify import Record, prepared_transactions, read_table, read_topic, topic_ends
from eos_ops.verify_checks import (
    Check,
    check_changelog,
    check_final_rows,
    check_rows,
    choose_identity,
    identity_of,
    identity_with_fields,
)
from eos_ops.verify_compare import Instant, Position, Tolerance, canonical
from eos_ops.verify_decode import FormatDecoder, Poison

TopicPartition = tuple[str, int]
SINK_KINDS = ("kafka", "postgres", "delta")  # an entry's section: its attribute
STATEFUL = {"Aggregate", "Distinct", "Deduplicate", "DeduplicateWithinWatermark", "Join", "FlatMapGroupsWithState"}


# ---------------------------------------------------------------------------------------------
# Where the run started and how far it got: the checkpoint
# ---------------------------------------------------------------------------------------------


@dataclass
class Epoch:
    number: int
    watermark_ms: int  # the watermark Spark ran the epoch with (0: none yet)
    ends: dict[str, dict[TopicPartition, int]]  # source -> its end offsets


@dataclass
class Progress:
    found: bool = False  # the checkpoint has eos's metadata
    starts: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    committed: int | None = None  # the last committed epoch
    epochs: list[Epoch] = field(default_factory=list)  # the offset log's retained epochs, up to `committed`
    pending: int | None = None  # logged, not committed

    def ends(self, source: str) -> dict[TopicPartition, int] | None:
        """The source's end offsets after the last committed epoch; None without a checkpoint."""
        if not self.found:
            return None
        if self.committed is None or not self.epochs or self.epochs[-1].number != self.committed:
            return dict(self.starts.get(source, {}))  # nothing committed: nothing expected
        return self.epochs[-1].ends.get(source, {})

    def late_watermark(self, source: str, tp: TopicPartition, offset: int) -> int:
        """The watermark a stateful operator dropped late rows by in the epoch that read `offset`:
        the previous epoch's (Spark filters late rows by the previous micro-batch's watermark and
        evicts state by the current one, SPARK-40925). 0 if unknown (no longer logged)."""
        for index, epoch in enumerate(self.epochs):
            if offset < epoch.ends.get(source, {}).get(tp, -1):
                previous = self.epochs[index - 1] if index > 0 else None
                return previous.watermark_ms if previous and previous.number == epoch.number - 1 else 0
        return 0


def _offsets(data: dict[str, dict[str, int]]) -> dict[TopicPartition, int]:
    return {(topic, int(p)): int(o) for topic, parts in data.items() for p, o in parts.items()}


def read_progress(config: PipelineConfig, base_dir: Path, spark: Any) -> Progress:
    """The sources' pinned starts and the committed epochs' ends and watermarks, read as files
    (eos's metadata, Spark's offset and commit logs)."""
    from eos.protocol.checkpoint import Checkpoint

    checkpoint = Checkpoint(config.checkpoint_path(base_dir), spark)
    meta = checkpoint.read_meta()
    if meta is None:
        return Progress()
    progress = Progress(True, {name: _offsets(pin.get("starting", {})) for name, pin in meta.sources.items()})
    progress.committed = checkpoint.last_committed_epoch()
    logged = checkpoint.last_logged_epoch()
    if logged is not None and (progress.committed is None or logged > progress.committed):
        progress.pending = logged
    for number in range(progress.committed + 1 if progress.committed is not None else 0):
        try:
            lines = checkpoint.offset_log(number).splitlines()
        except CheckpointError:
            continue  # Spark keeps the last 100 epochs' logs (minBatchesToRetain)
        scans = [json.loads(line) if line != "-" else {} for line in lines[2:]]
        ends = {}
        for source in config.sources:
            topics = set(source.kafka.topics)
            ends[source.name] = next((_offsets(s) for s in scans if s and set(s) <= topics), {})
        watermark = int(json.loads(lines[1]).get("batchWatermarkMs", 0)) if len(lines) > 1 else 0
        progress.epochs.append(Epoch(number, watermark, ends))
    return progress


# ---------------------------------------------------------------------------------------------
# The input, read and decoded by verify itself
# ---------------------------------------------------------------------------------------------


@dataclass
class SourceInput:
    entry: Any
    schema: Any  # the view's Spark StructType
    good: list[tuple[Record, tuple[Any, ...]]] = field(default_factory=list)  # record, its view row
    poison: list[tuple[Record, str]] = field(default_factory=list)  # record, why
    event_ms: dict[tuple[str, int, int], int] = field(default_factory=dict)  # the watermark column
    unread: int = 0  # offsets past the last committed epoch (not expected yet)
    span: str = ""

    @property
    def records(self) -> int:
        return len(self.good) + len(self.poison)


def _metadata_fields(key_type: Any) -> list[Any]:
    from pyspark.sql import types as T

    headers = T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))
    return [
        T.StructField("key", key_type), T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()), T.StructField("headers", headers),
    ]  # fmt: skip


def read_source(entry: Any, progress: Progress, base_dir: Path, zone: str) -> SourceInput:
    """The source's records from its start to the last committed epoch's end, decoded as the
    view eos gives SQL: a record value's fields plus _key, _topic, _partition, _offset,
    _timestamp, _headers; raw and string values keep Kafka's layout (key, value, topic, ...)."""
    from pyspark.sql import types as T

    kafka = entry.kafka
    client = kafka.client()
    read_committed = kafka.isolation == "read_committed"
    one_topic = kafka.topics[0] if len(kafka.topics) == 1 else ""
    keys = FormatDecoder(entry.key_format, base_dir, zone, one_topic, "key")
    values = FormatDecoder(entry.value_format, base_dir, zone, one_topic, "value")
    metadata = _metadata_fields(keys.spark_type())
    flattened = entry.value_format.type in ("json", "avro")
    if flattened:
        value_type = values.spark_type()
        if not isinstance(value_type, T.StructType):
            raise ConfigError(f"source {entry.name}: a {entry.value_format.type} value must be a record")
        schema = T.StructType([*value_type.fields, *(T.StructField(f"_{f.name}", f.dataType) for f in metadata)])
    else:
        schema = T.StructType([metadata[0], T.StructField("value", values.spark_type()), *metadata[1:]])
    source = SourceInput(entry, schema)
    ends = progress.ends(entry.name)
    starts = progress.starts.get(entry.name) if progress.found else None
    if starts is None:
        if kafka.starting_offsets == "latest":
            raise ConfigError(
                f"source {entry.name} starts at `latest` and its checkpoint holds no starting offsets: verify cannot "
                "know which records the run read",
                hint="verify after the pipeline has run (its checkpoint pins where it started)",
            )
        starts = {} if kafka.starting_offsets == "earliest" else _offsets(kafka.starting_offsets)
    watermark = entry.watermark
    event_at = schema.names.index(watermark.column) if watermark and watermark.column in schema.names else None
    for topic in kafka.topics:
        start = {p: o for (t, p), o in starts.items() if t == topic}
        end = None
        if ends is not None:
            logged = {p: o for (t, p), o in ends.items() if t == topic}
            end = {}
            for p, (_, last) in topic_ends(client, topic, read_committed).items():
                end[p] = logged.get(p, start.get(p, 0))  # a partition no epoch has read yet: nothing
                source.unread += max(0, last - max(end[p], start.get(p, 0)))
        for record in read_topic(client, topic, read_committed, start, end):
            try:
                key = keys.decode(record.key)
            except Poison as why:
                source.poison.append((record, f"key: {why}"))
                continue
            try:
                value = values.decode(record.value)
            except Poison as why:
                source.poison.append((record, f"value: {why}"))
                continue
            stamp = datetime.fromtimestamp(record.timestamp_ms / 1000, tz=timezone.utc)
            headers = [{"key": k, "value": v} for k, v in record.headers]
            meta = (key, record.topic, record.partition, record.offset, stamp, headers)
            if flattened:
                fields = [(value or {}).get(f.name) for f in value_type.fields]
                row = (*fields, *meta)
            else:
                row = (key, value, *meta[1:])
            source.good.append((record, row))
            if event_at is not None and isinstance(row[event_at], datetime):
                source.event_ms[(record.topic, record.partition, record.offset)] = canonical(row[event_at]).millis
    origin = "the checkpoint's starting offsets" if progress.found else f"`{kafka.starting_offsets}`"
    if ends is None:
        source.span = f"from {origin} to the current end"
    elif progress.committed is None:
        source.span = f"from {origin}: no epoch committed yet"
    else:
        source.span = f"from {origin} to the end of epoch {progress.committed}"
    return source


# ---------------------------------------------------------------------------------------------
# The expected output: the transforms as a batch query
# ---------------------------------------------------------------------------------------------


def verify_session(spark: Any, config: PipelineConfig) -> Any:
    """A session of its own (its views and SQL settings), with the pipeline's `spark.sql.*`
    settings that decide results (time zone, ANSI mode...), and Spark's warnings off."""
    spark.sparkContext.setLogLevel("ERROR")
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", "UTC")  # eos's default
    for key, value in config.spark.conf.items():
        if key.startswith("spark.sql.") and not key.startswith(("spark.sql.streaming.", "spark.sql.shuffle.")):
            with contextlib.suppress(Exception):  # a static setting: the session keeps Spark's
                session.conf.set(key, str(value))
    return session


def _import(reference: str, base_dir: Path) -> Any:
    module_name, _, function_name = reference.partition(":")
    if str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))  # modules beside the pipeline file
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"python transform {reference!r}: {exc}") from None


def build_views(
    session: Any, config: PipelineConfig, sources: list[SourceInput], base_dir: Path, without: set[Any]
) -> None:
    """Every source as a view of its decoded rows (minus `without`), then every transform."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    for source in sources:
        names = source.schema.names
        rows = [
            dict(zip(names, row, strict=True))
            for record, row in source.good
            if (record.topic, record.partition, record.offset) not in without
        ]
        # Through Arrow: a local relation in the JVM, no Python worker (a list of rows would be
        # a Python RDD, run by Python workers).
        table = pa.Table.from_pylist(rows, schema=to_arrow_schema(source.schema, timezone="UTC"))
        view = session.createDataFrame(table, source.schema)
        if source.entry.watermark is not None:  # a no-op in batch; kept so the SQL plans as written
            watermark = source.entry.watermark
            view = view.withWatermark(watermark.column, f"{int(watermark.delay * 1000)} milliseconds")
        view.createOrReplaceTempView(source.entry.name)
    previous = config.sources[-1].name
    for transform in config.transforms:
        try:
            if transform.sql is not None:
                result = session.sql(transform.sql)
            else:
                function = _import(transform.python, base_dir)
                result = function(session.table(transform.input or previous), **transform.args)
        except EosError:
            raise
        except Exception as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ConfigError(
                f"transform {transform.name!r} cannot run as a batch query: {first}",
                hint="check this pipeline with a verify spec instead (`eos verify --spec`, docs/VERIFY.md)",
            ) from None
        result.createOrReplaceTempView(transform.name)
        previous = transform.name


def plan_nodes(frame: Any) -> set[str]:
    """The names of the logical plan's nodes (Aggregate, Deduplicate, Join, ...)."""
    text = frame._jdf.queryExecution().analyzed().toString()
    return {m.group(1) for m in re.finditer(r"^[\s:+\-|]*([A-Z][A-Za-z]+)", text, re.MULTILINE)}


def window_end(view: Any, config: PipelineConfig) -> tuple[Any, str]:
    """A column with each output row's window end, and how it was found; (None, why not)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    for f in view.schema.fields:
        if isinstance(f.dataType, T.StructType) and {"start", "end"} <= set(f.dataType.names):
            return F.col(f"`{f.name}`.`end`"), f"the window column {f.name}.end"
    stamps = [f.name for f in view.schema.fields if isinstance(f.dataType, T.TimestampType)]
    for name in stamps:
        if name.lower() == "end" or name.lower().endswith("_end"):
            return F.col(f"`{name}`"), f"the column {name}"
    sizes = {
        size.strip().lower()
        for t in config.transforms if t.sql
        for size in re.findall(r"\bwindow\s*\(\s*[^,()]+,\s*'([^']+)'", t.sql, re.IGNORECASE)
    }  # fmt: skip
    for name in stamps:
        if (name.lower() == "start" or name.lower().endswith("_start")) and len(sizes) == 1:
            size = sizes.pop()
            return F.col(f"`{name}`") + F.expr(f"INTERVAL '{size}'"), f"the column {name} + the SQL's window of {size}"
    return None, "no window end among the output's columns (select window.end, or a column named *_end, to tell)"


@dataclass
class Expected:
    rows: list[Any]
    ends: list[Instant | None]  # each row's window end, if known
    nodes: set[str]
    end_found: str  # how the window ends were found, or why not
    columns: list[str]  # a table's columns to compare

    def split(self, open_after: int) -> tuple[list[Any], list[Any]]:
        """(closed, open): rows whose window ends after `open_after` are still open."""
        closed = [end is None or end.millis <= open_after for end in self.ends]
        return (
            [row for row, done in zip(self.rows, closed, strict=True) if done],
            [row for row, done in zip(self.rows, closed, strict=True) if not done],
        )


def expected_rows(session: Any, config: PipelineConfig, entry: Any, kind: str, with_end: bool) -> Expected:
    """A sink's expected rows as the output will read them: a Kafka sink's {key, value} (encoded
    as its formats encode them), a table's columns."""
    from pyspark.sql import functions as F

    view = session.table(config.sink_input(entry))
    columns = [F.col(f"`{c}`") for c in view.columns]
    names: list[str] = []
    if kind == "kafka":
        if entry.value is not None:
            value = F.expr(entry.value)
        elif entry.value_format.type in ("json", "avro"):
            value = F.struct(*columns)
        elif "value" in view.columns:
            value = F.col("value")
        else:
            raise ConfigError(f"sink {entry.name}: say which column is the value (value: ...)")
        key = F.expr(entry.key) if entry.key else F.lit(None)
        parts = [
            _as_written(key, entry.key_format.type).alias("key"),
            _as_written(value, entry.value_format.type).alias("value"),
        ]
    else:  # a table: postgres or delta, their sections' `columns` alike
        table = getattr(entry, kind)
        chosen = [F.expr(e).alias(n) for n, e in table.columns.items()] if table.columns else columns
        parts = [F.struct(*chosen).alias("value")]
        names = list(table.columns) if table.columns else list(view.columns)
    end, how = window_end(view, config) if with_end else (None, "")
    if end is not None:
        parts.append(end.alias("window_end"))
    rows, ends = [], []
    for (text,) in view.select(F.to_json(F.struct(*parts))).collect():
        data = json.loads(text)
        ends.append(canonical(data.pop("window_end", None)))
        rows.append(canonical(data if kind == "kafka" else data.get("value", {})))
    return Expected(rows, ends, plan_nodes(view), how, names)


def _as_written(column: Any, format_type: str) -> Any:
    """A key or value as its format writes it (string: Spark's cast; raw: bytes)."""
    if format_type == "string":
        return column.cast("string")
    if format_type == "raw":
        return column.cast("binary")
    return column


# ---------------------------------------------------------------------------------------------
# The committed output, and the checks
# ---------------------------------------------------------------------------------------------


def _output_decoder(fmt: Any, base_dir: Path, topic: str, which: str) -> Any:
    if fmt.type == "json":
        return lambda data: None if data is None else json.loads(data)
    return FormatDecoder(fmt, base_dir, "UTC", topic, which).decode


def read_kafka_sink(entry: Any, base_dir: Path, check: Check) -> list[tuple[Any, Position]]:
    client, topic = entry.kafka.client(), entry.kafka.topic
    committed = read_topic(client, topic, read_committed=True)
    check.output_records = len(committed)
    check.read_uncommitted = len(read_topic(client, topic, read_committed=False))
    keys = _output_decoder(entry.key_format, base_dir, topic, "key")
    values = _output_decoder(entry.value_format, base_dir, topic, "value")
    rows = []
    for record in committed:
        try:
            row = {"key": keys(record.key), "value": values(record.value)}
        except (Poison, ValueError) as exc:
            check.undecodable.append(f"{record.topic}/{record.partition}@{record.offset}: {exc}")
            continue
        rows.append((canonical(row), Position(record.partition, record.offset, record.timestamp_ms)))
    return rows


def read_postgres_sink(entry: Any, wanted: list[str], check: Check) -> list[Any]:
    pg = entry.postgres
    rows = [row for _, row in read_table(pg.dsn, pg.table)]
    check.output_records = len(rows)
    check.prepared = prepared_transactions(pg.dsn)
    return _columns(entry, pg.table, rows, wanted)


def read_delta_sink(entry: Any, base_dir: Path, pipeline: str, wanted: list[str], check: Check) -> list[Any]:
    """The table's latest version as delta-rs reads it (eos_ops.delta: no code of eos's sink), and
    the attempts the sink left staged in the table's folder (invisible to readers until committed)."""
    from deltalake.exceptions import TableNotFoundError

    from eos_connectors.delta import staging
    from eos_connectors.delta.config import secret_option
    from eos_connectors.delta.table import Store, resolve_uri
    from eos_ops.delta import read_table as read_delta

    delta = entry.delta
    uri = resolve_uri(delta.table, base_dir)  # as the sink resolves it: beside the pipeline file
    check.target = f"Delta table {uri}"
    try:
        rows = read_delta(uri, delta.storage_options)
        # Listed only; Store makes a local table's folder when missing, and the table exists here.
        staged = staging.attempts(Store(uri, delta.storage_options), pipeline, entry.name)
    except TableNotFoundError:
        raise ConfigError(f"sink {entry.name}: there is no Delta table at {uri}") from None
    except Exception as exc:
        why = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        for name, value in delta.storage_options.items():
            if value and secret_option(name):
                why = why.replace(value, "***")  # the storage options' credentials never show
        raise EnvironmentProblem(f"sink {entry.name}: reading the Delta table at {uri} failed: {why}") from None
    check.output_records = len(rows)
    check.prepared = len(staged)
    if staged:
        check.notes.append(
            f"staged attempts in {uri}/{staging.folder(pipeline, entry.name)}/: "
            + ", ".join(a.stem for a in staged[:5])
            + " (the next run or `eos delta cleanup` resolves them)"
        )
    return _columns(entry, uri, rows, wanted)


def _columns(entry: Any, table: str, rows: list[dict[str, Any]], wanted: list[str]) -> list[Any]:
    """A table's rows as compared: only the expected columns, canonical."""
    if rows:
        missing = [c for c in wanted if c not in rows[0]]
        if missing:
            raise ConfigError(f"sink {entry.name}: table {table} has no column {', '.join(map(repr, missing))}")
    return [canonical({c: row.get(c) for c in wanted}) for row in rows]


def check_sink(
    entry: Any,
    kind: str,
    config: PipelineConfig,
    base_dir: Path,
    expected: Expected,
    without_late: Expected | None,
    open_after: int | None,
    tol: Tolerance,
) -> Check:
    update = config.epochs.output_mode == "update"
    aggregate = bool({"Aggregate", "Distinct"} & expected.nodes)  # SELECT DISTINCT streams as an aggregate
    rows = expected.rows
    alternative = without_late.rows if without_late is not None else None
    check = Check(f"sink {entry.name}", "", "")
    if open_after is not None and not update and aggregate:
        if any(end is not None for end in expected.ends) or not rows:
            rows, check.open = expected.split(open_after)
            if without_late is not None:
                alternative = without_late.split(open_after)[0]
        else:
            check.notes.append(f"cannot tell which windows are still open: {expected.end_found}")
    if kind == "kafka":
        check.target = f"Kafka topic {entry.kafka.topic}"
        seen = read_kafka_sink(entry, base_dir, check)
        key = identity_of(lambda row: row.get("key"))
        with_fields = identity_with_fields(lambda row: row.get("key"))
        if update and aggregate:
            candidates = [("its key", key), ("its key and non-numeric fields", with_fields)]
            chosen = choose_identity(rows, candidates)
            if chosen is None:
                check.semantics = "update mode: every final row present (no key tells the rows apart)"
                check_final_rows(check, rows, [row for row, _ in seen], tol)
            else:
                check.semantics = f"update mode: a changelog, the last value per {chosen[0]} counts"
                check_changelog(check, rows, seen, chosen[1], tol, alternative)
        else:
            check.semantics = "every row exactly once"
            pair = (choose_identity(rows, [("key", key)]) or ("", with_fields))[1] if entry.key else None
            check_rows(check, rows, [row for row, _ in seen], tol, pair, alternative)
        return check
    if kind == "postgres":
        check.target = f"PostgreSQL table {entry.postgres.table}"
        seen_rows = read_postgres_sink(entry, expected.columns, check)
    else:
        seen_rows = read_delta_sink(entry, base_dir, config.name, expected.columns, check)
    table = getattr(entry, kind)  # postgres and delta sections alike: mode, key
    if table.mode == "upsert":
        check.semantics = f"upsert: the last value per key ({', '.join(table.key)}) counts"
        key = identity_of(lambda row: {k: row.get(k) for k in table.key})
        check_changelog(check, rows, [(row, None) for row in seen_rows], key, tol, alternative)
    elif update and aggregate:
        check.semantics = "update mode into an append table: every final row present"
        check_final_rows(check, rows, seen_rows, tol)
    else:
        check.semantics = "every row exactly once"
        check_rows(check, rows, seen_rows, tol, None, alternative)
    return check


def _header(record: Record, name: str) -> str | None:
    for key, value in record.headers:
        if key == name:
            return value.decode("utf-8", errors="replace") if value is not None else None
    return None


def check_dead_letters(source: SourceInput, pipeline: str) -> Check:
    """Every poison record of the source in its DLQ exactly once, as it was read (its raw key and
    value), and nothing else of this pipeline's source."""
    entry = source.entry
    check = Check(f"dead letters of source {entry.name}", f"Kafka topic {entry.dlq_topic}", "every poison record once")
    client = entry.kafka.client()

    def ours(records: list[Record]) -> list[Record]:
        return [r for r in records if _header(r, "eos.pipeline") == pipeline and _header(r, "eos.source") == entry.name]

    committed = read_topic(client, entry.dlq_topic, read_committed=True)
    mine = ours(committed)
    others = len(committed) - len(mine)
    check.output_records = len(mine)
    check.read_uncommitted = len(ours(read_topic(client, entry.dlq_topic, read_committed=False)))
    expected = {f"{r.topic}/{r.partition}@{r.offset}": (r, why) for r, why in source.poison}
    check.expected = len(expected)
    seen: Counter[str] = Counter()
    for letter in mine:
        where = f"{_header(letter, 'eos.topic')}/{_header(letter, 'eos.partition')}@{_header(letter, 'eos.offset')}"
        seen[where] += 1
        if where in expected:
            original = expected[where][0]
            if (letter.key, letter.value) != (original.key, original.value):
                check.wrong.append((where, _raw(letter), _raw(original)))
        else:
            check.unexpected.append(f"{where} (not a poison record of the checked input)")
    check.lost = [f"{where}: {why}" for where, (_, why) in expected.items() if where not in seen]
    check.duplicated = [f"{where} x{n}" for where, n in seen.items() if n > 1]
    if others:
        check.notes.append(f"{others} records of other pipelines or sources in the topic (not checked)")
    return check


def _raw(record: Record) -> dict[str, Any]:
    return {"key": record.key, "value": (record.value or b"")[:60]}


# ---------------------------------------------------------------------------------------------
# All of it
# ---------------------------------------------------------------------------------------------


@dataclass
class PipelineReport:
    pipeline: str
    file: str
    sources: list[str]  # a line per source
    checks: list[Check]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def lines(self) -> Iterable[str]:
        yield f"eos verify: pipeline {self.pipeline} ({self.file})"
        yield from self.sources
        for note in self.notes:
            yield f"note: {note}"
        for check in self.checks:
            yield from check.lines()
        failed = [f"{check.name}: {check.summary()}" for check in self.checks if not check.ok]
        yield "result: EXACTLY ONCE" if self.ok else f"result: FAILED ({'; '.join(failed)})"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "pipeline": self.pipeline, "file": self.file, "sources": self.sources,
                "notes": self.notes, "checks": [check.to_json() for check in self.checks]}  # fmt: skip


def verify_pipeline(path: str | Path, tolerance: Tolerance | None = None, spark: Any = None) -> PipelineReport:
    """Check every sink and DLQ of the pipeline file at `path` (see the module doc). `spark`: a
    SparkSession to run the batch query in (default: a local[2] one, stopped afterwards)."""
    path = Path(path)
    config = load_pipeline(path)
    base_dir = path.resolve().parent
    kinds = [next((k for k in SINK_KINDS if hasattr(e, k)), "?") for e in config.sinks]
    for entry, kind in zip(config.sinks, kinds, strict=True):
        if kind == "?":
            raise ConfigError(
                f"sink {entry.name}: eos verify reads Kafka topics, PostgreSQL tables and Delta tables only"
            )
    for entry in config.sources:
        if not hasattr(entry, "kafka"):
            raise ConfigError(f"source {entry.name}: eos verify reads Kafka sources only")
    own = False
    if spark is None:
        from pyspark import SparkContext

        from eos.sparksession import build_spark

        own = SparkContext._active_spark_context is None  # stop only a Spark this call started
        spark = build_spark("eos-verify", master="local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PySpark's UserWarnings: nothing for a user to act on
            return _verify(config, path, base_dir, kinds, tolerance or Tolerance(), spark)
    finally:
        if own:
            spark.stop()


def _verify(
    config: PipelineConfig, path: Path, base_dir: Path, kinds: list[str], tol: Tolerance, spark: Any
) -> PipelineReport:
    began = time.monotonic()
    notes: list[str] = []
    session = verify_session(spark, config)
    zone = str(config.spark.conf.get("spark.sql.session.timeZone", "UTC"))
    progress = read_progress(config, base_dir, spark)
    if not progress.found:
        notes.append("no checkpoint: the whole input is expected (the pipeline has not run, or was reset)")
    if progress.pending is not None:
        notes.append(f"epoch {progress.pending} is pending (logged, not committed): its input is not expected yet")
    sources = [read_source(entry, progress, base_dir, zone) for entry in config.sources]
    read_s = time.monotonic() - began

    sinks = list(zip(config.sinks, kinds, strict=True))
    build_views(session, config, sources, base_dir, set())
    final_watermark = _final_watermark(sources)
    expected = [expected_rows(session, config, e, k, final_watermark is not None) for e, k in sinks]
    stateful = set().union(*(x.nodes for x in expected)) & STATEFUL
    late = _late_records(sources, progress) if final_watermark is not None and stateful else set()
    alternatives: list[Expected | None] = [None] * len(expected)
    if late:
        notes.append(
            f"{len(late)} records had event times at or below the watermark their epoch dropped late rows by: "
            "streaming drops them from stateful operators where the batch query counts them; rows they change may "
            "hold either value"
        )
        build_views(session, config, sources, base_dir, late)
        alternatives = [expected_rows(session, config, e, k, True) for e, k in sinks]
    spark_s = time.monotonic() - began - read_s
    open_after = None
    if final_watermark is not None:
        logged = progress.epochs[-1].watermark_ms if progress.epochs else None
        open_after = final_watermark if logged is None else min(logged, final_watermark)
        behind = logged is not None and logged < final_watermark
        notes.append(
            f"watermark: max event time minus the delay is {Instant(final_watermark)}"
            + (
                f"; the last epoch ran with {Instant(logged or 0)} (later windows close at the next epoch)"
                if behind
                else ""
            )
        )
        if {"Deduplicate", "DeduplicateWithinWatermark"} & stateful:
            notes.append(
                "duplicates are dropped within the watermark: a duplicate that arrives after its first copy's state "
                "expired passes in streaming but not in this batch check (it would show as unexpected)"
            )
    if "Join" in stateful:
        notes.append(
            "stream-stream joins: outer joins' unmatched rows come only once the watermark passes (not modelled)"
        )

    checks = [
        check_sink(entry, kind, config, base_dir, wanted, alternative, open_after, tol)
        for (entry, kind), wanted, alternative in zip(sinks, expected, alternatives, strict=True)
    ]
    for source in sources:
        if source.entry.on_error == "dlq":
            checks.append(check_dead_letters(source, config.name))
        elif source.entry.on_error == "fail" and source.poison:
            failed = Check(f"source {source.entry.name}", f"Kafka topics {', '.join(source.entry.kafka.topics)}",
                           "on_error: fail: every record must decode")  # fmt: skip
            failed.undecodable = [f"{r.topic}/{r.partition}@{r.offset}: {why}" for r, why in source.poison]
            failed.output_records = failed.read_uncommitted = source.records
            checks.append(failed)
    notes.append(
        f"expected output: the transforms as a batch Spark query over the decoded input; read {read_s:.1f} s, "
        f"Spark {spark_s:.1f} s, in all {time.monotonic() - began:.1f} s"
    )
    return PipelineReport(config.name, str(path), [_source_line(s) for s in sources], checks, notes)


def _source_line(source: SourceInput) -> str:
    entry = source.entry
    policy = f" (on_error: {entry.on_error})" if source.poison else ""
    unread = f"; {source.unread} offsets later, not read by the pipeline yet" if source.unread else ""
    return (
        f"source {entry.name}: {source.records} records of {', '.join(entry.kafka.topics)} "
        f"({entry.kafka.isolation}, {source.span}{unread}): {len(source.good)} decoded, "
        f"{len(source.poison)} poison{policy}"
    )


def _final_watermark(sources: list[SourceInput]) -> int | None:
    """Spark's watermark once the whole input is read: per source its max event time minus the
    delay, the query's the minimum of those (Spark's default policy; sources without rows do
    not count)."""
    marks = [
        max(s.event_ms.values()) - int(s.entry.watermark.delay * 1000)
        for s in sources
        if s.entry.watermark is not None and s.event_ms
    ]
    return min(marks) if marks else None


def _late_records(sources: list[SourceInput], progress: Progress) -> set[tuple[str, int, int]]:
    """Records whose event time was at or below the late-row watermark of the epoch that read
    them: a stateful operator may have dropped them (it does when their window had closed)."""
    late = set()
    for source in sources:
        for at, event in source.event_ms.items():
            mark = progress.late_watermark(source.entry.name, (at[0], at[1]), at[2])
            if mark > 0 and event <= mark:
                late.add(at)
    return late

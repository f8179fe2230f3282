"""The Delta table as the sink sees it: where it is, whether eos can write it, and the Parquet data
files it adds (their partition folders, partition values and statistics, per the Delta protocol).

Everything goes through delta-rs (`deltalake`): the table's log, and its object store for files
(`Store`), so a local path and an `s3://` URI with `storage_options` take the same code.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from eos.api import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

# Delta's name for a null partition value's folder (the protocol's `partitionValues` holds null).
NULL_FOLDER = "__HIVE_DEFAULT_PARTITION__"
# Partition columns eos can encode as the protocol says (timestamps and floats have ambiguous
# string forms across engines: refused rather than guessed).
PARTITION_TYPES = {"string", "byte", "short", "integer", "long", "boolean", "date"}
# Writer features whose rules only a full Delta writer enforces on the rows (constraints,
# generated or identity values, column mapping's physical names): eos adds its own Parquet
# files in append mode, so it refuses these tables there (upsert goes through delta-rs's MERGE).
UNSUPPORTED_FOR_APPEND = {"checkConstraints", "generatedColumns", "identityColumns", "invariants", "rowTracking"}


def resolve_uri(table: str, base_dir: Path | None) -> str:
    """A URI as delta-rs takes it; a local path relative to the pipeline file's folder."""
    if "://" in table:
        return table
    path = Path(table).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return str(path.resolve())


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def open_table(uri: str, options: dict[str, str]) -> DeltaTable | None:
    """The table at its latest version, or None when there is no Delta table there."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(uri, options or None):
        return None
    return DeltaTable(uri, storage_options=options or None)


class Store:
    """The table's folder through delta-rs's object store (its URI and storage options): a local
    disk and S3 take the same calls. Paths are relative to the table. (Its pyarrow handler is used
    as it is, not through `pyarrow.fs.PyFileSystem`, whose writes hand it Arrow buffers where it
    takes bytes: a file is built in memory and put in one piece, atomically on object stores.)"""

    def __init__(self, uri: str, options: dict[str, str]):
        from deltalake._internal import DeltaFileSystemHandler

        if is_local(uri):
            Path(uri.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        self._fs = DeltaFileSystemHandler(uri, options or None)

    def put(self, path: str, data: bytes) -> None:
        out = self._fs.open_output_stream(path)
        try:
            out.write(data)
        finally:
            out.close()

    def get(self, path: str) -> bytes:
        """The file's bytes (FileNotFoundError if it is gone)."""
        source = self._fs.open_input_file(path)
        try:
            return source.read()
        finally:
            source.close()

    def size(self, path: str) -> int | None:
        from pyarrow.fs import FileType

        info = self._fs.get_file_info([path])[0]
        return info.size if info.type == FileType.File else None

    def listing(self, folder: str) -> list[str]:
        """The files directly in `folder` (none if it does not exist)."""
        from pyarrow.fs import FileType

        infos = self._fs.get_file_info_selector(folder, allow_not_found=True, recursive=False)
        return sorted(info.path for info in infos if info.type == FileType.File)

    def delete(self, paths: list[str]) -> int:
        """Delete these files (gone already is fine); returns how many were deleted."""
        removed = 0
        for path in paths:
            try:
                self._fs.delete_file(path)
                removed += 1
            except FileNotFoundError:
                pass
        return removed


# ---------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------


def arrow_schema(spark_schema: Any) -> pa.Schema:
    """The rows' Arrow schema (timestamps in UTC: Delta's `timestamp` is an instant)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def delta_types(schema: Any) -> dict[str, Any]:
    """name -> the Delta type of each top-level field (nullability and metadata left out)."""

    def bare(value: Any) -> Any:
        if isinstance(value, dict):
            drop = ("nullable", "metadata", "containsNull", "valueContainsNull")
            return {k: bare(v) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [bare(v) for v in value]
        return value

    return {f["name"]: bare(f["type"]) for f in json.loads(schema.to_json())["fields"]}


def shown(delta_type: Any) -> str:
    return delta_type if isinstance(delta_type, str) else json.dumps(delta_type, separators=(",", ":"))


def check_compatible(sink: str, where: str, table: DeltaTable, rows: pa.Schema, partition_by: list[str] | None) -> None:
    """The rows must fit the existing table: every column there with the same Delta type, the
    same partition columns; columns the rows lack must be nullable (they read as null)."""
    from deltalake import Schema

    have = delta_types(table.schema())
    want = delta_types(Schema.from_arrow(rows))
    missing = [n for n in want if n not in have]
    if missing:
        raise ConfigError(
            f"sink {sink}: the Delta table at {where} has no column {', '.join(repr(m) for m in missing)} "
            f"(its columns: {', '.join(have)})",
            hint="add the columns to the table (ALTER TABLE ... ADD COLUMNS), or map the rows onto its columns with "
            "`columns:`",
        )
    differ = [f"{n} is {shown(have[n])} in the table, {shown(t)} in the rows" for n, t in want.items() if have[n] != t]
    if differ:
        raise ConfigError(
            f"sink {sink}: the rows do not fit the Delta table at {where}: {'; '.join(differ)}",
            hint="cast the columns in a transform or with `columns:` (name: CAST(expression AS type))",
        )
    required = [f.name for f in table.schema().fields if not f.nullable and f.name not in want]
    if required:
        raise ConfigError(
            f"sink {sink}: the Delta table at {where} has NOT NULL columns the rows lack: {', '.join(required)}",
            hint="produce them in the rows, or with `columns:`",
        )
    actual = list(table.metadata().partition_columns)
    if partition_by is not None and list(partition_by) != actual:
        raise ConfigError(
            f"sink {sink}: partition_by {partition_by} differs from the Delta table's partition columns {actual} at "
            f"{where}",
            hint=f"set partition_by: {actual} (or leave it out: it only matters when eos creates the table)",
        )


def check_partition_columns(sink: str, schema: Any, partition_by: list[str]) -> None:
    types = delta_types(schema)
    for name in partition_by:
        if name not in types:
            raise ConfigError(f"sink {sink}: partition column {name!r} is not among the rows' columns {list(types)}")
        if types[name] not in PARTITION_TYPES:
            raise ConfigError(
                f"sink {sink}: partition column {name!r} is {shown(types[name])}; eos partitions by "
                f"{', '.join(sorted(PARTITION_TYPES))} columns",
                hint="partition by a string or date derived from it (e.g. `columns: {day: to_date(event_time)}`)",
            )


def check_writable(sink: str, where: str, table: DeltaTable, mode: str) -> None:
    """Refuse tables whose rules eos's own data files could break (see UNSUPPORTED_FOR_APPEND)."""
    if mode != "append":
        return
    config = table.metadata().configuration
    features = set(table.protocol().writer_features or [])
    found = sorted(features & UNSUPPORTED_FOR_APPEND)
    if config.get("delta.columnMapping.mode", "none") != "none":
        found.append("columnMapping")
    found += sorted(k for k in config if k.startswith("delta.constraints."))
    if found:
        raise ConfigError(
            f"sink {sink}: the Delta table at {where} uses {', '.join(found)}, which eos's append mode does not "
            "enforce when it adds its Parquet files",
            hint="write it with `mode: upsert` (delta-rs's MERGE enforces them), or into a table without them",
        )


# ---------------------------------------------------------------------------------------------
# Partition folders and statistics (the add action's fields)
# ---------------------------------------------------------------------------------------------


def partition_value(value: Any) -> str | None:
    """The protocol's string form of a partition value (an empty string is null there)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def partition_folder(values: dict[str, str | None]) -> str:
    """Hive-style folders (`day=2024-05-01/`), each value percent-encoded as delta-rs does."""
    return "".join(f"{k}={NULL_FOLDER if v is None else quote(v, safe='')}/" for k, v in values.items())


_STATS_TYPES = ("int", "uint", "string", "large_string", "date32", "timestamp")


def _stat_value(value: Any, floor: bool) -> Any:
    if isinstance(value, dt.datetime):  # timestamps in ms, the precision readers expect; bounds stay bounds
        value = value.astimezone(dt.timezone.utc) if value.tzinfo else value
        micros = value.microsecond % 1000
        if micros and not floor:
            value += dt.timedelta(microseconds=1000 - micros)
        else:
            value -= dt.timedelta(microseconds=micros)
        text = value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}"
        return text + ("Z" if value.tzinfo else "")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


class FileStats:
    """A data file's statistics: record count, null counts, and min/max of the top-level columns
    whose order every reader agrees on (integers, strings, dates, timestamps). Floats, decimals,
    booleans and nested columns get null counts only: missing bounds only cost data skipping."""

    def __init__(self, schema: pa.Schema):
        self.records = 0
        self.nulls = {f.name: 0 for f in schema if not _nested(f.type)}
        self.bounded = [f.name for f in schema if any(str(f.type).startswith(t) for t in _STATS_TYPES)]
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        self.records += batch.num_rows
        for name in self.nulls:
            self.nulls[name] += batch.column(name).null_count
        for name in self.bounded:
            found = pc.min_max(batch.column(name)).as_py()
            low, high = found["min"], found["max"]
            if low is None:
                continue
            if name not in self.low or low < self.low[name]:
                self.low[name] = low
            if name not in self.high or high > self.high[name]:
                self.high[name] = high

    def to_json(self) -> str:
        return json.dumps(
            {
                "numRecords": self.records,
                "minValues": {k: _stat_value(v, floor=True) for k, v in self.low.items()},
                "maxValues": {k: _stat_value(v, floor=False) for k, v in self.high.items()},
                "nullCount": self.nulls,
            },
            separators=(",", ":"),
            allow_nan=False,
            default=_finite,
        )


def _nested(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_nested(arrow_type)


def _finite(value: Any) -> Any:  # pragma: no cover - only bounded types reach the stats
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("non-finite statistic")
    raise TypeError(f"cannot encode {value!r} in a statistic")

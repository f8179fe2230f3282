"""The Delta Lake sink of the Python API: `delta.Sink(...)` builds the same typed entry a pipeline
file's `delta:` section gives (eos_connectors.delta.config)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from eos_connectors.declare import entry
from eos_connectors.delta.config import DeltaSinkEntry


def Sink(
    name: str,
    *,
    table: str,
    mode: Literal["append", "upsert"] = "append",
    key: Sequence[str] | None = None,
    partition_by: Sequence[str] | None = None,
    create_table: bool = False,
    columns: Mapping[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> DeltaSinkEntry:
    """A Delta Lake sink: each slot stages its rows as Parquet files in the table's folder, and the
    driver commits every slot's files in one Delta version with the epoch (docs/DELTA.md).
    `table`: a local path or a URI delta-rs opens (`s3://...` with `storage_options`).
    `mode="upsert"` MERGEs by `key` (one row per key per epoch); `columns`: name -> SQL expression
    over the rows (default: the rows' columns)."""
    section = {
        "table": table,
        "mode": mode,
        "key": list(key) if key is not None else None,
        "partition_by": list(partition_by) if partition_by is not None else None,
        "create_table": create_table,
        "columns": dict(columns) if columns is not None else None,
        "storage_options": dict(storage_options) if storage_options is not None else None,
    }
    return entry(
        DeltaSinkEntry,
        f"delta.Sink({name!r})",
        {"name": name, "delta": {k: v for k, v in section.items() if v is not None}},
    )

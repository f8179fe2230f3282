"""Delta tables from outside the pipeline: read one back with delta-rs's own reader (for `eos
verify` and the tests: no eos code between the table's log and the rows), and remove what a
stopped pipeline left staged in its Delta sinks (`eos delta cleanup`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_table(uri: str | Path, storage_options: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every row of the table's latest version, as delta-rs reads it (its log, its Parquet reader)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(uri), storage_options=dict(storage_options) if storage_options else None)
    return table.to_pyarrow_table().to_pylist()


def cleanup(path: Path, take_over: bool = False) -> int:
    """Resolve a stopped pipeline's staged Delta files by its recorded decision, as recovery does:
    commit the attempts the last decision commits (unless the table's log shows them committed),
    remove every other one. Refused while the pipeline's driver answers (eos.driver.take_over);
    otherwise this command takes the pipeline over, so no driver can decide behind its back."""
    from eos_connectors.delta.sink import DeltaSink
    from eos_ops.stopped import taken_over

    with taken_over(path, DeltaSink, "stages nothing", take_over) as stopped:
        total = 0
        for sink in stopped.sinks:
            done = sink.resolve_staged(stopped.decision)
            if not done:
                print(f"sink {sink.name}: nothing staged in {sink.uri}")
            for attempt, what in done:
                print(f"sink {sink.name}: {what} {attempt}")
            total += len(done)
        print(f"done: {total} staged attempts resolved")
        return 0

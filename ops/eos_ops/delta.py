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
    remove every other one. Refused while the pipeline's driver answers (eos.runner.take_over);
    otherwise this command takes the pipeline over, so no driver can decide behind its back."""
    import os
    import socket
    import uuid

    from eos.config import load_pipeline
    from eos.errors import ConfigError
    from eos.pipeline import connectors, pipeline_info
    from eos.protocol.checkpoint import Checkpoint
    from eos.protocol.decision import DriverInfo
    from eos.runner import take_over as take_pipeline_over
    from eos_connectors.delta.sink import DeltaSink

    config = load_pipeline(path)
    base_dir = path.resolve().parent
    if not config.exactly_once:
        raise ConfigError(f"{path}: pipeline {config.name} runs at-least-once: it stages nothing")
    meta = Checkpoint(config.checkpoint_path(base_dir)).read_meta()
    found = connectors(config, pipeline_info(config, meta.checkpoint_id if meta else "-", base_dir))
    sinks = [s for s in found.sinks if isinstance(s, DeltaSink)]
    if not sinks:
        raise ConfigError(f"{path}: pipeline {config.name} has no delta sink")
    control = found.sources[0].control_log()
    try:
        # No vote service: the address answers nobody, so the next `eos run` is never refused.
        me = DriverInfo(f"cleanup-{uuid.uuid4().hex[:8]}", socket.gethostname(), os.getpid(), "127.0.0.1:0")
        state = take_pipeline_over(control, me, take_over)
        decision = state.decision
        said = f"epoch {decision.epoch} attempt {decision.attempt}" if decision else "none"
        print(f"pipeline {config.name}: took over from the last driver; recorded decision: {said}")
        total = 0
        for sink in sinks:
            done = sink.resolve_staged(decision)
            if not done:
                print(f"sink {sink.name}: nothing staged in {sink.uri}")
            for attempt, what in done:
                print(f"sink {sink.name}: {what} {attempt}")
            total += len(done)
        print(f"done: {total} staged attempts resolved")
        return 0
    finally:
        control.close()

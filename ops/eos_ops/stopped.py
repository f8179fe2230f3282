"""Working on a stopped pipeline's leftovers from outside it (`eos postgres cleanup`, `eos delta
cleanup`): its sinks of one kind, and the pipeline taken over so that no driver can record a
decision behind the tool's back. Refused while the pipeline's driver answers (eos.driver.take_over)."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Stopped:
    config: Any  # the pipeline's config
    sinks: list[Any]  # its sinks of the kind asked for
    decision: Any  # the control log's last recorded decision, or None


@contextlib.contextmanager
def taken_over(path: Path, kind: type, what: str, take_over: bool) -> Iterator[Stopped]:
    """The pipeline of `path` taken over, with its sinks of class `kind`. `what` names what such a
    sink leaves behind, for the refusals ("prepares no transactions")."""
    from eos.config import load_pipeline
    from eos.declared import connectors, pipeline_info
    from eos.driver import take_over as take_pipeline_over
    from eos.errors import ConfigError
    from eos.protocol.checkpoint import Checkpoint
    from eos.protocol.decision import DriverInfo

    config = load_pipeline(path)
    base_dir = path.resolve().parent
    if not config.exactly_once:
        raise ConfigError(f"{path}: pipeline {config.name} runs at-least-once: it {what}")
    meta = Checkpoint(config.checkpoint_path(base_dir)).read_meta()
    found = connectors(config, pipeline_info(config, meta.checkpoint_id if meta else "-", base_dir))
    sinks = [s for s in found.sinks if isinstance(s, kind)]
    if not sinks:
        raise ConfigError(f"{path}: pipeline {config.name} has no {kind.kind} sink")
    control = found.sources[0].control_log()
    try:
        # No vote service: the address answers nobody, so the next `eos run` is never refused.
        me = DriverInfo(f"cleanup-{uuid.uuid4().hex[:8]}", socket.gethostname(), os.getpid(), "127.0.0.1:0")
        state = take_pipeline_over(control, me, take_over)
        decision = state.decision
        said = f"epoch {decision.epoch} attempt {decision.attempt}" if decision else "none"
        print(f"pipeline {config.name}: took over from the last driver; recorded decision: {said}")
        yield Stopped(config, sinks, decision)
    finally:
        control.close()
        for connector in [*found.sources, *found.sinks]:
            connector.close()

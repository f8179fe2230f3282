"""Step 1, prepare: the epoch's plan, built by the driver after Spark logged the epoch's offsets
(the barrier) and shipped to every slot task (eos.protocol.slot: what every epoch shares inside
the job's function, the epoch attempt in the job's local property).

Slots: the epoch's rows are one DataFrame, the union of every sink's rows (each sink's rows in
a struct column of its own, tagged with the sink's index). A slot is one partition of that
DataFrame. No shuffle routes rows to slots: the partitioning Spark derives from the logged
offsets (the source's read tasks) or from the pinned state partitions (aggregations) is
already deterministic, so a replay of the epoch gives every slot the same records.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from eos.failpoints import DISARMED, Failpoints
from eos.protocol.channel import CoordinatorAddress
from eos.protocol.sink import PipelineInfo, WriterFactory

SINK_TAG = "_eos_sink"


def sink_column(index: int) -> str:
    return f"_eos_s{index}"


def digest(data: Any) -> str:
    """A stable digest of JSON-able data (or of text as it is)."""
    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SinkPlan:
    name: str
    index: int
    writer: WriterFactory | None  # None: rows are only counted (poison records under on_error: skip)
    by_owner: bool  # committed by the writer's own process (Recovery.REPLAY)


@dataclass(frozen=True)
class EpochPlan:
    """Everything a slot needs for one attempt of one epoch (see the module doc for how it travels)."""

    pipeline: PipelineInfo
    epoch: int
    attempt: int
    run: str
    offsets: str  # digest of the epoch's offset log file: written into every ledger entry
    config: str  # digest of the replay config
    sinks: tuple[SinkPlan, ...]
    skip: frozenset[tuple[str, int]]  # (sink, slot) that already committed this epoch
    coordinator: CoordinatorAddress | None  # with the run key (the vote service's MACs): never logged
    timeout_s: float
    failpoints: Failpoints = DISARMED

    @property
    def exactly_once(self) -> bool:
        return self.pipeline.exactly_once

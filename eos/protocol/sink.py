"""The sink API: what a two-phase-commit sink implements for the epoch protocol to drive it.

A sink knows its external system; the protocol knows epochs, slots, votes and recovery. One
sink = one `SinkConnector` (driver side) and the `SlotWriter`s it opens in Spark tasks.

Per epoch attempt, for each slot (a partition of the epoch's rows), in a Spark task:
  1. `WriterFactory.open(ctx)`             begin a transaction for (sink, slot, epoch, attempt)
  2. `SlotWriter.write(batch)` ...          write the slot's rows into it
  3. `SlotWriter.precommit(entry)`          add the slot's ledger entry to the SAME transaction and make
                                            it durable but invisible (flush / PREPARE TRANSACTION);
                                            returns a `Prepared` handle; the slot then votes
Then on the driver, once every slot has voted: `SinkConnector.agree` (a last check; raising aborts),
and once the decision is recorded:
  4. commit: a sink whose prepared transaction can be committed from anywhere (`Recovery.RESUME`,
     e.g. PostgreSQL's COMMIT PREPARED) is committed by the driver (`SinkConnector.commit`); one
     whose transaction only its own producer can commit (`Recovery.REPLAY`, Kafka through
     librdkafka) is committed by the writer's process (`SlotWriter.commit`, on a thread of the
     Python worker that outlives the task).
  5. abort: `SlotWriter.abort` (best effort) and `SinkConnector.discard` for pre-commits nobody
     will commit (a retried task's earlier attempt).

Recovery, on the driver, before any epoch runs (and between failed attempts):
  - `fence(sinks, pools)`: REPLAY sinks abort whatever the pipeline left open and make every
    older producer unable to commit (Kafka: `init_transactions` on every transactional id);
  - `resolve(sinks, decision)`: RESUME sinks commit the prepared transactions of the recorded
    decision and roll back every other one;
  - `read_ledger(sinks)`: the last committed entry per (sink, slot), read after every sink of
    every system is fenced or resolved, so nothing can still commit behind the reader's back.
A replayed epoch then writes only the slots whose ledger entry is older than the epoch.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from eos.model import Model
from eos.protocol.decision import Decision, Pool
from eos.protocol.ledger import Ledger, LedgerEntry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class Recovery(enum.Enum):
    REPLAY = "fence-and-replay"  # a pre-committed transaction dies with its producer
    RESUME = "resume-and-commit"  # a prepared transaction survives and any session may commit it


@dataclass(frozen=True)
class PipelineInfo:
    """What every connector may know about the pipeline it serves."""

    name: str
    checkpoint_id: str
    exactly_once: bool
    epoch_timeout_s: float
    base_dir: Path | None = None  # the pipeline file's folder (relative schema paths)
    ledger: str = ""  # the name of the pipeline's ledger (`ledger.topic`, for sinks that keep it in Kafka)


@dataclass(frozen=True)
class Prepared:
    """One slot's pre-committed transaction."""

    sink: str
    slot: int
    handle: str  # what identifies the transaction in its system (transactional id, prepared gid)
    records: int
    task_attempt: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Lease:
    """An id from a sink's pool of transactional identities, granted to one worker process."""

    number: int
    fresh: bool  # True: the worker must (re)initialise it, fencing any earlier holder
    stale: tuple[int, ...] = ()  # ids this worker offered but no longer holds: close them


class SlotContext:
    """What a writer gets from the protocol in the task (implemented by eos.protocol.slot)."""

    pipeline: PipelineInfo
    sink: str
    slot: int
    epoch: int
    attempt: int
    task_attempt: int
    worker: str  # identifies this Python worker process

    def lease(self, idle: list[int]) -> Lease:  # pragma: no cover - interface
        """An id of this sink's pool for this slot: one of `idle` (ids this process holds with no
        transaction open) when possible, else another one to initialise."""
        raise NotImplementedError

    def hit(self, point: str) -> None:  # pragma: no cover - interface
        """A failure-injection point of the protocol (tests)."""
        raise NotImplementedError


class SlotWriter(ABC):
    @abstractmethod
    def write(self, batch: Any) -> None:
        """Write a pyarrow RecordBatch of this sink's rows (the columns `SinkConnector.rows` made)."""

    @abstractmethod
    def precommit(self, entry: LedgerEntry) -> Prepared:
        """Write `entry` into the transaction and make it durable but invisible."""

    def commit(self) -> None:
        """REPLAY sinks: commit the prepared transaction (the protocol decided so)."""
        raise NotImplementedError(f"{type(self).__name__} is committed by the driver")

    @abstractmethod
    def abort(self) -> None:
        """Best effort; recovery aborts whatever is left anyway."""

    def records(self) -> int:
        return 0


class WriterFactory(ABC):
    """Pickled into the tasks: opens one writer per (slot, attempt)."""

    @abstractmethod
    def open(self, ctx: SlotContext) -> SlotWriter: ...


class SinkEntry(Model):
    """The part of a sink's entry in the pipeline file that every kind of sink has."""

    name: str
    input: str | None = None


def pinned_identity(entry: Model, kind: str, reach_settings: tuple[str, ...]) -> dict[str, Any]:
    """A source's or sink's entry as a replay must repeat it: without the settings of its `kind`
    section that may change while an epoch is pending (`reach_settings`)."""
    identity = entry.model_dump(mode="json", by_alias=True)
    if reach_settings:
        identity[kind] = {k: v for k, v in identity[kind].items() if k not in reach_settings}
    return identity


class SinkConnector(ABC):
    """Driver side of one configured sink."""

    kind: ClassVar[str]
    entry_model: ClassVar[type[SinkEntry]]
    recovery: ClassVar[Recovery]
    # Settings of the entry's `kind` section that may change while an epoch is pending: how to
    # reach the system (address, credentials) and tuning, never where or how rows are written.
    # They are left out of the replay identity, which the checkpoint keeps, so a secret among them
    # never reaches the checkpoint either.
    reach_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, entry: SinkEntry, pipeline: PipelineInfo):
        self.entry = entry
        self.pipeline = pipeline

    @property
    def name(self) -> str:
        return self.entry.name

    @abstractmethod
    def describe(self) -> str:
        """One line for `eos validate` and logs: where the rows go (no secrets)."""

    def replay_identity(self) -> dict[str, Any]:
        """What decides where and how a replay writes (pinned while an epoch is pending)."""
        return pinned_identity(self.entry, self.kind, self.reach_settings)

    def validate(self) -> None:  # noqa: B027 - optional
        """Offline checks for `eos validate` (schema files exist and parse); no network."""

    @abstractmethod
    def check(self, spark: Any) -> None:
        """Up-front checks with clear errors (destination exists, settings the protocol needs)."""

    def set_up(self) -> None:  # noqa: B027 - optional
        """Slow set-up that recovery and the first epoch need (creating a ledger topic), after every
        check passed; not the protocol's prepare phase: nothing of an epoch is written here. It runs
        on another thread while the query is built (`rows` included), so it must not share a
        connection with them; its errors are raised before anything of the pipeline starts. What
        is quick to make can stay in `check`."""

    @abstractmethod
    def rows(self, view: DataFrame) -> DataFrame:
        """The columns the slot writers receive, computed from the sink's input view."""

    @abstractmethod
    def writer(self) -> WriterFactory: ...

    @abstractmethod
    def system(self) -> str:
        """Identity of the external system (a Kafka cluster id, a database): sinks are grouped by it."""

    # -- recovery and commit (driver side); called on all sinks of one kind at once -------------
    def pool(self, size: int) -> Pool:
        """The record of this sink's pool of transactional identities (REPLAY sinks)."""
        return Pool(size, type(self).kind, self.system())

    @classmethod
    def fence(cls, sinks: list[SinkConnector], pools: dict[str, Pool], timeout_s: float) -> int:
        """REPLAY: abort what is open and fence every earlier holder of every id of `pools` (the
        pools recorded on these sinks' system, including those of sinks no longer configured);
        returns how many ids were fenced."""
        return 0

    @classmethod
    def resolve(cls, sinks: list[SinkConnector], decision: Decision | None) -> dict[str, int]:
        """RESUME: commit the decision's prepared transactions, roll back the rest; returns counts."""
        return {}

    @classmethod
    @abstractmethod
    def read_ledger(cls, sinks: list[SinkConnector]) -> Ledger:
        """The latest committed entry of each (sink, slot) of these sinks."""

    def agree(self, prepared: list[Prepared]) -> None:  # noqa: B027 - optional
        """Step 3, on the driver: this sink's pre-commits of the attempt, before the decision is
        recorded. Raising aborts the attempt with nothing of it committed anywhere (a check only
        the whole epoch's output can answer: a Delta MERGE's one row per key)."""

    def commit(self, prepared: list[Prepared]) -> None:
        """RESUME: commit these prepared transactions from the driver."""
        raise NotImplementedError

    def discard(self, prepared: list[Prepared]) -> None:  # noqa: B027 - optional
        """Abort pre-commits that will never be committed (their task was retried)."""

    @abstractmethod
    def forget(self) -> None:
        """`eos reset`: delete this sink's ledger entries (its output stays where it is)."""

    def lingering(self) -> list[str]:
        """For `eos status`: transactions of this pipeline left open in the system."""
        return []

    def close(self) -> None:  # noqa: B027 - optional
        pass


# A callable that turns a view into a sink's rows, for sinks eos itself adds (counting skipped
# poison records needs no external system).
RowsFn = Callable[["DataFrame"], "DataFrame"]

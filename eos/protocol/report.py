"""What travels back: a slot's typed report to the driver, and the driver's reports to listeners
(progress output and metrics)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from eos.protocol.ledger import Ledger
from eos.protocol.sink import Prepared


@dataclass
class SinkWork:
    """One slot's work for one sink in one epoch attempt."""

    records: int = 0
    skipped: int = 0  # rows not written because the ledger says this slot committed the epoch
    prepared: Prepared | None = None
    by_owner: bool = False  # committed by the writer's process (True) or by the driver (False)
    init_s: float = 0.0  # time to get a transactional identity (0 when a live one was reused)
    reused: bool = False


@dataclass
class SlotReport:
    """Returned by every slot task as its result row (one per partition of the epoch's rows)."""

    slot: int
    task_attempt: int
    worker: str
    host: str
    pid: int
    sinks: dict[str, SinkWork] = field(default_factory=dict)
    write_s: float = 0.0  # reading the slot's input (the epoch's read and transform stage) and writing
    precommit_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SlotReport:
        data = json.loads(text)
        sinks = {}
        for name, work in data.pop("sinks").items():
            prepared = work.pop("prepared")
            sinks[name] = SinkWork(**work, prepared=Prepared(**prepared) if prepared else None)
        return cls(**data, sinks=sinks)

    def prepared(self) -> list[Prepared]:
        return [w.prepared for w in self.sinks.values() if w.prepared is not None]


@dataclass
class EpochReport:
    """What one committed epoch did."""

    epoch: int
    attempts: int
    records_out: dict[str, int]
    replay_skipped: dict[str, int]
    skipped_slots: int
    counted_only: dict[str, int]  # poison records counted under on_error: skip
    job_s: float  # the Spark job: read, transform, write and pre-commit of every slot
    decide_s: float  # recording the commit decision durably
    commit_s: float
    slots: list[SlotReport] = field(default_factory=list)
    committed_at: float = field(default_factory=time.time)
    txn_commits: int = 0


@dataclass
class AttemptVotes:
    """What a failed attempt had pre-committed and committed, for listeners."""

    epoch: int
    attempt: int
    prepared: dict[int, dict[str, int]]  # slot -> sink -> records in its pre-committed transaction
    committed: frozenset[int]


@dataclass
class RecoveryReport:
    fenced_ids: int
    resolved: dict[str, int]  # RESUME sinks: prepared transactions committed / rolled back
    duration_s: float  # the whole recovery: fence, resolve, read the ledgers
    ledger: Ledger
    reason: str


# Phases of an epoch attempt, in order (EpochListener.on_phase).
WRITE = "write"  # the Spark job: read, transform, write and pre-commit every slot
DECIDE = "decide"  # recording the commit decision
COMMIT = "commit"  # slots committing
PHASES = (WRITE, DECIDE, COMMIT)


class EpochListener:
    """Progress output and metrics implement this; every method is optional."""

    def on_recovery(self, report: RecoveryReport) -> None: ...
    def on_epoch_start(self, epoch: int, attempt: int) -> None: ...
    def on_phase(self, epoch: int, attempt: int, phase: str) -> None: ...
    def on_epoch_committed(self, report: EpochReport) -> None: ...
    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None: ...
    def on_attempt_failed(self, votes: AttemptVotes) -> None: ...

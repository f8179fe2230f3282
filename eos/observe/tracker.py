"""What the driver knows about the epoch in flight: its phase, and how long transactions are open.

Fed by the protocol's events (an EpochListener: `on_phase` WRITE, DECIDE, COMMIT) and Spark's
progress; read by the metrics (at scrape time) and by the live progress line. With the
coordinator at hand, the write and commit phases show how far the slots are: how many
transactions were pre-committed and voted `prepared` (write), how many of them are committed
(commit). Slots whose sink the driver commits (PostgreSQL) do not vote: they show up in the
report at the end of the job, not here.

Open transactions: a slot opens its transactions during the Spark job of an attempt and they are
committed in the commit phase (or aborted). The driver cannot see the exact begin, so the age of
the oldest open transaction is measured from the start of the attempt (an upper bound: the safe
side for an alert). After a failed attempt its transactions count as open until the recovery's
fencing has aborted them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from eos.protocol.report import COMMIT as COMMIT_PHASE
from eos.protocol.report import DECIDE as DECIDE_PHASE
from eos.protocol.report import WRITE as WRITE_PHASE
from eos.protocol.report import EpochListener, EpochReport, RecoveryReport

# Bounded phase names (metric label values).
BETWEEN = "between_epochs"  # waiting for the trigger, or Spark planning the next epoch
WRITE = WRITE_PHASE  # the Spark job: read, transform, write and pre-commit every slot
DECIDE = DECIDE_PHASE  # recording the commit decision in the control log
COMMIT = COMMIT_PHASE  # decided: slots committing their transactions
MARK_COMMITTED = "mark_committed"  # every slot committed; Spark writes its commit log
RECOVERING = "recovering"  # an attempt failed: fencing, resolving, re-reading the ledgers
PHASES = (BETWEEN, WRITE, DECIDE, COMMIT, MARK_COMMITTED, RECOVERING)


@dataclass(frozen=True)
class Phase:
    name: str
    epoch: int | None
    attempt: int
    elapsed_s: float  # since the phase began
    prepared: int = 0  # transactions voted prepared in this attempt (slots whose process commits them)
    committed: int = 0  # of those, committed

    def describe(self) -> str:
        if self.epoch is None or self.name == BETWEEN:
            return "waiting for the next epoch"
        what = self.name.replace("_", " ")
        if self.name == WRITE:
            what = "read+write+pre-commit" + (f", {self.prepared} prepared" if self.prepared else "")
        elif self.name == COMMIT and self.prepared:
            what += f" {self.committed}/{self.prepared}"
        retry = f" attempt {self.attempt}" if self.attempt > 1 else ""
        return f"epoch {self.epoch}{retry}: {what} ({self.elapsed_s:.1f}s)"


class EpochTracker(EpochListener):
    def __init__(self, exactly_once: bool = True, coordinator: Any = None):
        self.exactly_once = exactly_once
        self.coordinator = coordinator
        self._lock = threading.Lock()
        self._phase = BETWEEN
        self._epoch: int | None = None
        self._attempt = 0
        self._since = time.monotonic()
        self._open_since: float | None = None
        self.last_committed_epoch: int | None = None
        self.last_committed_at: float | None = None  # wall clock

    def _set(self, phase: str) -> None:
        self._phase, self._since = phase, time.monotonic()

    # -- events --------------------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, attempt: int) -> None:
        with self._lock:
            self._epoch, self._attempt = epoch, attempt
            self._set(WRITE)
            if self.exactly_once and self._open_since is None:
                self._open_since = self._since

    def on_phase(self, epoch: int, attempt: int, phase: str) -> None:
        with self._lock:
            self._epoch, self._attempt = epoch, attempt
            if phase != self._phase:
                self._set(phase)

    def on_epoch_committed(self, report: EpochReport) -> None:
        with self._lock:
            self._set(MARK_COMMITTED)
            self._open_since = None
            self.last_committed_epoch, self.last_committed_at = report.epoch, report.committed_at

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        with self._lock:
            self._set(RECOVERING)  # transactions stay "open" until the fence

    def on_recovery(self, report: RecoveryReport) -> None:
        with self._lock:
            self._set(BETWEEN)
            self._open_since = None  # every transactional id was fenced: nothing of ours is open

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        with self._lock:
            if progress.get("batchId") == self._epoch and self._phase == MARK_COMMITTED:
                self._set(BETWEEN)

    # -- reading -------------------------------------------------------------------------------
    def phase(self) -> Phase:
        with self._lock:
            name, epoch, attempt, since = self._phase, self._epoch, self._attempt, self._since
        prepared = committed = 0
        if name in (WRITE, DECIDE, COMMIT) and self.coordinator is not None and epoch is not None:
            votes = self.coordinator.votes(epoch, attempt)
            prepared, committed = len(votes), sum(1 for v in votes if v.committed)
        return Phase(name, epoch, attempt, time.monotonic() - since, prepared, committed)

    def oldest_open_transaction_s(self) -> float:
        with self._lock:
            return 0.0 if self._open_since is None else time.monotonic() - self._open_since

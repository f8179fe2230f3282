"""What the driver knows about the epoch in flight: its phase, and how long transactions are open.

Fed by the protocol's events (an EpochListener) and Spark's progress; read by the metrics (at
scrape time) and by the live progress line. With the coordinator at hand the phase inside the
sink job is exact: no vote yet (reading, processing, pre-committing), votes arriving
(agreement), decided commit (slots committing).

Open transactions: a slot opens its transactions during the sink job of an attempt and commits
or aborts them before the job ends. The driver cannot see the exact begin, so the age of the
oldest open transaction is measured from the start of the attempt (an upper bound, which is the
safe side for an alert on `transaction.timeout.ms`). After a failed attempt its transactions
count as open until the recovery's fencing has aborted them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from eos.protocol.report import EpochListener, EpochReport, RecoveryReport

# Bounded phase names (metric label values).
BETWEEN = "between_epochs"  # waiting for the trigger, or Spark planning the next epoch
SINK_JOB = "read_precommit"  # the slots read, process, produce and flush; no vote yet
AGREEMENT = "agreement"  # some slots voted prepared; waiting for the rest and the decision
COMMIT = "commit"  # decided commit; slots committing their transactions
MARK_COMMITTED = "mark_committed"  # transactions committed; Spark writes its commit log
RECOVERING = "recovering"  # an attempt failed: fencing and re-reading the ledger
PHASES = (BETWEEN, SINK_JOB, AGREEMENT, COMMIT, MARK_COMMITTED, RECOVERING)


@dataclass(frozen=True)
class Phase:
    name: str
    epoch: int | None
    attempt: int
    elapsed_s: float  # since the attempt (or the phase, between epochs) began
    votes: int = 0  # slots that voted prepared (agreement) or committed (commit)
    slots: int = 0

    def describe(self) -> str:
        if self.epoch is None or self.name == BETWEEN:
            return "waiting for the next epoch"
        what = self.name.replace("_", " ")
        if self.name == SINK_JOB:
            what = "read+process+pre-commit"
        elif self.name in (AGREEMENT, COMMIT) and self.slots:
            what += f" {self.votes}/{self.slots}"
        retry = f" attempt {self.attempt}" if self.attempt > 1 else ""
        return f"epoch {self.epoch}{retry}: {what} ({self.elapsed_s:.1f}s)"


class EpochTracker(EpochListener):
    def __init__(self, slots: int, exactly_once: bool = True, coordinator: Any = None):
        self.slots = slots
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
            self._set(SINK_JOB)
            if self.exactly_once and self._open_since is None:
                self._open_since = self._since

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
        votes = 0
        if name == SINK_JOB and self.coordinator is not None and epoch is not None:
            votes = len(self.coordinator.votes(epoch, attempt))
            if votes:
                name = AGREEMENT
        return Phase(name, epoch, attempt, time.monotonic() - since, votes, self.slots)

    def oldest_open_transaction_s(self) -> float:
        with self._lock:
            return 0.0 if self._open_since is None else time.monotonic() - self._open_since

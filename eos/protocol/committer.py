"""The epoch commit protocol, driver side. Spark calls `EpochCommitter` once per epoch
(`foreachBatch`), after it has logged the epoch's offsets (prepare / the barrier).

For epoch N, attempt a:
  1. skip set: the (sink, slot) pairs the ledger says already committed N (a replay);
  2. open attempt a in the coordinator; run one barrier stage of `slots` tasks, one per slot:
     each pre-commits, votes, and commits only on a unanimous `commit` decision;
  3. success: remember the committers, report, return; Spark then writes its commit log
     (mark committed) and the source publishes offsets for lag monitoring;
  4. failure: abort the attempt, fence every transactional id (zombies lose their right to
     commit, open transactions are aborted), re-read the ledger, and retry the epoch, up to
     `tolerable_failures` consecutive failed attempts.

Recovery after a crash is the same step 4 at start-up: Spark replays the last logged but
uncommitted epoch with the same offsets and state; the ledger tells each slot whether it
already committed it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eos_connectors.formats import POISON_MARKER
from eos_connectors.kafka.ledger import Ledger, LedgerEntry, ensure_ledger_topic, fence, read_ledger
from eos_connectors.kafka.sink import REPORT_SCHEMA, EpochPlan, SinkTarget, slot_task

from eos.errors import CheckpointError, EpochFailed
from eos.failpoints import Failpoints
from eos.protocol.coordinator import Coordinator

log = logging.getLogger("eos.protocol.committer")


@dataclass
class EpochReport:
    """What one committed epoch did; fed to progress output and metrics."""

    epoch: int
    attempts: int
    records_out: dict[str, int]
    replay_skipped: dict[str, int]  # records not re-written because the ledger had them
    skipped_slots: int  # (sink, slot) pairs skipped via the ledger
    counted_only: dict[str, int]  # poison records counted under on_error: skip
    job_s: float
    read_process_s: float
    precommit_s: float
    vote_wait_s: float
    agreement_s: float | None  # from the last vote to the decision (the protocol's own cost)
    commit_s: float
    committed_at: float = field(default_factory=time.time)
    txn_commits: int = 0
    # The slots' own reports (records per sink, timings, ...), for per-slot metrics.
    slot_reports: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AttemptVotes:
    """What the coordinator saw of a failed attempt: the slots that pre-committed (records per
    sink in their transactions) and the slots that reported their commit before it failed."""

    epoch: int
    attempt: int
    prepared: dict[int, dict[str, int]]
    committed: frozenset[int]


@dataclass
class RecoveryReport:
    fenced_ids: int
    fence_s: float
    ledger: Ledger
    reason: str


class EpochListener:
    """Progress output and metrics implement this; every method is optional."""

    def on_recovery(self, report: RecoveryReport) -> None: ...
    def on_epoch_start(self, epoch: int, attempt: int) -> None: ...
    def on_epoch_committed(self, report: EpochReport) -> None: ...
    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None: ...
    def on_attempt_failed(self, votes: AttemptVotes) -> None: ...


# A raised poison-record error has real values where the plan has expressions: Spark quotes the
# logical plan (which contains the raise_error expression and its text) in query failures.
_POISON = re.compile(
    re.escape(POISON_MARKER) + r": source \S+: cannot decode the record at \S+/\d+ offset \d+: .*?(?=\s*SQLSTATE|$)"
)
_OURS = re.compile(r"(?:SourceError|SlotAborted|FailpointError|RangeReadError): (.*)")


def user_message(exc: BaseException) -> str | None:
    """The line a user should see, dug out of a Spark/Py4J error, if it is one of ours."""
    for line in str(exc).splitlines():
        found = _POISON.search(line)
        if found:
            return found.group(0).strip()
    for line in str(exc).splitlines():
        found = _OURS.search(line)
        if found:
            return re.sub(r"\s*SQLSTATE: \w+\s*$", "", found.group(1)).strip()
    return None


def _is_permanent(exc: BaseException) -> bool:
    """Errors an epoch retry cannot fix: stop at once with the message."""
    text = str(exc)
    return bool(_POISON.search(text)) or "SourceError: " in text


@dataclass
class Cluster:
    """The sinks (and dead-letter queues) that live on one Kafka cluster share its ledger topic."""

    client: dict[str, Any]
    targets: list[SinkTarget]


class EpochCommitter:
    def __init__(
        self,
        spark,
        pipeline: str,
        checkpoint_id: str,
        slots: int,
        exactly_once: bool,
        targets: dict[str, SinkTarget],
        ledger_topic: str,
        coordinator: Coordinator | None,
        epoch_timeout_s: float,
        tolerable_failures: int,
        min_pause_s: float = 0.0,
        failpoints: Failpoints | None = None,
        listeners: Iterable[EpochListener] = (),
    ):
        self.spark = spark
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.slots = slots
        self.exactly_once = exactly_once
        self.targets = targets
        self.ledger_topic = ledger_topic
        self.coordinator = coordinator
        self.epoch_timeout_s = epoch_timeout_s
        self.tolerable_failures = tolerable_failures
        self.min_pause_s = min_pause_s
        self.failpoints = failpoints or Failpoints()
        self.listeners = list(listeners)
        self.ledger: Ledger = {}
        self.owners: dict[str, str] = {}
        self.consecutive_failures = 0
        self.last_epoch_end = 0.0
        self.busy = threading.Lock()  # held while an epoch runs: graceful stop waits on it
        self.clusters = self._clusters()

    def _clusters(self) -> list[Cluster]:
        clusters: dict[str, Cluster] = {}
        for target in self.targets.values():
            if target.topic is None:
                continue
            key = json.dumps(target.client, sort_keys=True)
            clusters.setdefault(key, Cluster(target.client, [])).targets.append(target)
        return list(clusters.values())

    def transactional_ids(self) -> list[str]:
        return [
            f"{t.transactional_prefix}-{slot}" for c in self.clusters for t in c.targets for slot in range(self.slots)
        ]

    def _emit(self, method: str, *args: Any) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, method)(*args)
            except Exception:  # observers must never break the protocol
                log.exception("listener %s.%s failed", type(listener).__name__, method)

    # -- recovery --------------------------------------------------------------------------------
    def recover(self, reason: str) -> RecoveryReport:
        """Fence every transactional id of the pipeline, then read the ledger (in that order)."""
        started = time.monotonic()
        ledger: Ledger = {}
        fenced = 0
        for cluster in self.clusters:
            ids = [f"{t.transactional_prefix}-{slot}" for t in cluster.targets for slot in range(self.slots)]
            if self.exactly_once:
                ensure_ledger_topic(cluster.client, self.ledger_topic)
                fence(cluster.client, ids, timeout_s=max(60.0, self.epoch_timeout_s))
                fenced += len(ids)
                ledger.update(read_ledger(cluster.client, self.ledger_topic, self.pipeline))
        foreign = {e.checkpoint for e in ledger.values()} - {self.checkpoint_id}
        if foreign:
            raise CheckpointError(
                f"the ledger topic {self.ledger_topic} holds commits of pipeline {self.pipeline!r} from another "
                f"checkpoint ({', '.join(sorted(foreign))}), not from this one ({self.checkpoint_id}). Was the "
                "checkpoint deleted or replaced? Starting over would re-emit (or skip) output. If a fresh start is "
                "really intended, run `eos reset` first."
            )
        self.ledger = ledger
        self.owners = {}
        report = RecoveryReport(fenced, time.monotonic() - started, ledger, reason)
        self._emit("on_recovery", report)
        return report

    # -- one epoch -----------------------------------------------------------------------------
    def __call__(self, df, epoch: int) -> None:
        with self.busy:
            self._run_epoch(df, epoch)

    def _run_epoch(self, df, epoch: int) -> None:
        self.failpoints.hit("epoch.after_offsets_logged", epoch)
        pause = self.min_pause_s - (time.monotonic() - self.last_epoch_end)
        if self.last_epoch_end and pause > 0:
            time.sleep(pause)
        attempt = 0
        while True:
            attempt += 1
            self._emit("on_epoch_start", epoch, attempt)
            plan = self._plan(epoch, attempt)
            try:
                report = self._attempt(df, plan)
            except Exception as exc:
                if self.coordinator is not None:
                    self.coordinator.close_attempt(epoch, attempt, "the attempt failed")
                    self._emit_votes(epoch, attempt)
                reason = user_message(exc) or f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                if _is_permanent(exc):
                    self._emit("on_epoch_aborted", epoch, attempt, reason, False)
                    raise EpochFailed(f"epoch {epoch}: {reason}") from None
                self.consecutive_failures += 1
                retrying = self.consecutive_failures <= self.tolerable_failures
                self._emit("on_epoch_aborted", epoch, attempt, reason, retrying)
                if not retrying:
                    raise EpochFailed(
                        f"epoch {epoch} failed {self.consecutive_failures} consecutive times "
                        f"(tolerable_failures: {self.tolerable_failures}); last error: {reason}"
                    ) from exc
                self._recover_between_attempts(epoch, attempt)
                continue
            if self.coordinator is not None:
                self.coordinator.close_attempt(epoch, attempt, "finished")
            self.consecutive_failures = 0
            report.attempts = attempt
            self._emit("on_epoch_committed", report)
            self.failpoints.hit("epoch.after_commit", epoch)
            self.last_epoch_end = time.monotonic()
            return

    def _emit_votes(self, epoch: int, attempt: int) -> None:
        """Tell listeners which transactions a failed attempt pre-committed or committed."""
        state = self.coordinator.attempt_state(epoch, attempt) if self.coordinator is not None else None
        if state is None:
            return
        try:  # copies first: a late vote may still arrive on the coordinator's threads
            votes, committed = dict(state.prepared), frozenset(state.committed)
            prepared = {slot: dict(info.get("records", {})) for slot, info in votes.items()}
        except Exception:
            log.exception("could not read the votes of epoch %d attempt %d", epoch, attempt)
            return
        self._emit("on_attempt_failed", AttemptVotes(epoch, attempt, prepared, committed))

    def _recover_between_attempts(self, epoch: int, attempt: int) -> None:
        """Fence and re-read the ledger before the next attempt. The broker may be restarting:
        a failed recovery counts against the same tolerance, with a growing pause."""
        while True:
            try:
                self.recover(f"epoch {epoch} attempt {attempt} failed")
                return
            except CheckpointError:
                raise
            except Exception as exc:
                self.consecutive_failures += 1
                reason = f"recovery failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                retrying = self.consecutive_failures <= self.tolerable_failures
                self._emit("on_epoch_aborted", epoch, attempt, reason, retrying)
                if not retrying:
                    raise EpochFailed(
                        f"epoch {epoch}: {reason} (tolerable_failures: {self.tolerable_failures})"
                    ) from exc
                time.sleep(min(30.0, 2.0**self.consecutive_failures))

    def _plan(self, epoch: int, attempt: int) -> EpochPlan:
        skip = frozenset(key for key, entry in self.ledger.items() if entry.epoch >= epoch)
        return EpochPlan(
            pipeline=self.pipeline,
            checkpoint_id=self.checkpoint_id,
            epoch=epoch,
            attempt=attempt,
            slots=self.slots,
            exactly_once=self.exactly_once,
            targets=self.targets,
            ledger_topic=self.ledger_topic,
            skip=skip,
            owners=dict(self.owners),
            coordinator=self.coordinator.address if self.coordinator else None,
            timeout_s=self.epoch_timeout_s,
            failpoints=self.failpoints,
        )

    def _attempt(self, df, plan: EpochPlan) -> EpochReport:
        from pyspark.sql import functions as F

        if self.coordinator is not None:
            self.coordinator.open_attempt(
                plan.epoch, plan.attempt, range(self.slots), self.epoch_timeout_s,
                ordered_commit=self.failpoints.armed("sink.between_commits"),
            )  # fmt: skip
        # Deterministic routing: a record's slot is a hash of its key (or of its value when it
        # has no key), so a replay sends every record to the slot it went to the first time.
        routed = df.repartition(self.slots, F.coalesce(F.col("key"), F.col("value")))
        job = routed.mapInArrow(slot_task(plan), REPORT_SCHEMA, barrier=self.exactly_once)
        sc = self.spark.sparkContext
        tag = f"eos-{self.pipeline}-{plan.epoch}-{plan.attempt}-{uuid.uuid4().hex[:6]}"
        # The coordinator aborts undecided slots at the timeout; this ends a job whose tasks hang
        # anyway (a stalled slot after the decision, a read that never returns).
        watchdog = threading.Timer(self.epoch_timeout_s + 5, lambda: sc.cancelJobsWithTag(tag))
        watchdog.daemon = True
        started = time.perf_counter()
        sc.addJobTag(tag)
        watchdog.start()
        try:
            rows = job.collect()
        finally:
            watchdog.cancel()
            sc.removeJobTag(tag)
        job_s = time.perf_counter() - started
        reports = [json.loads(row.report) for row in rows]
        if sorted(r["slot"] for r in reports) != list(range(self.slots)):
            raise RuntimeError(f"expected one report from each of {self.slots} slots, got {len(reports)}")
        return self._absorb(plan, reports, job_s)

    def _absorb(self, plan: EpochPlan, reports: list[dict[str, Any]], job_s: float) -> EpochReport:
        """Fold the slots' reports into the ledger view, the owner map and one EpochReport."""
        records: dict[str, int] = {}
        replay: dict[str, int] = {}
        counted: dict[str, int] = {}
        commits = 0
        for report in reports:
            slot = report["slot"]
            for sink, n in report["records"].items():
                records[sink] = records.get(sink, 0) + n
                if self.exactly_once:
                    self.ledger[(sink, slot)] = LedgerEntry(
                        self.pipeline, sink, slot, plan.epoch, self.checkpoint_id, n
                    )
                    commits += 1
            for sink, n in report["replay_skipped"].items():
                replay[sink] = replay.get(sink, 0) + n
            for sink, n in report["counted_only"].items():
                counted[sink] = counted.get(sink, 0) + n
            self.owners.update(report["tokens"])

        def slowest(key: str) -> float:
            return max((r.get(key, 0.0) for r in reports), default=0.0)

        precommit = max((r.get("produce_s", 0.0) + r.get("flush_s", 0.0) for r in reports), default=0.0)
        slot_total = max(
            (sum(r.get(k, 0.0) for k in ("produce_s", "flush_s", "vote_s", "commit_s")) for r in reports), default=0.0
        )
        # The agreement's own cost: the slot that votes last waits for nothing but the round trip
        # (the others' waits also include how much slower the slowest slot was).
        votes = [r["vote_s"] for r in reports if "vote_s" in r]
        agreement = min(votes) if votes else None
        return EpochReport(
            epoch=plan.epoch,
            attempts=plan.attempt,
            records_out=records,
            replay_skipped=replay,
            skipped_slots=len(plan.skip),
            counted_only=counted,
            job_s=job_s,
            read_process_s=max(0.0, job_s - slot_total),
            precommit_s=precommit,
            vote_wait_s=slowest("vote_s"),
            agreement_s=agreement,
            commit_s=slowest("commit_s"),
            txn_commits=commits,
            slot_reports=reports,
        )


def fence_targets(targets: Iterable[SinkTarget], slots: int, timeout_s: float = 60.0) -> int:
    """Fence every transactional id of `targets` for slots 0..slots-1; returns how many."""
    count = 0
    for target in targets:
        if target.topic is None:
            continue
        ids = [f"{target.transactional_prefix}-{slot}" for slot in range(slots)]
        fence(target.client, ids, timeout_s)
        count += len(ids)
    return count

"""The epoch commit protocol, driver side. Spark calls `EpochCommitter` once per epoch
(`foreachBatch`), after it has logged the epoch's offsets: the barrier (step 1, prepare).

For epoch N, attempt a:
  2. plan: the slots whose ledger entry shows N (bound to the same offsets) write nothing; run one
     Spark job over the epoch's rows, one task per slot: each writes its rows and its ledger
     entry into a transaction and pre-commits it (eos.protocol.slot);
  3. agree: the job succeeded, so every slot pre-committed (a failed task fails the job);
  4. decide: record "epoch N attempt a commits these transactions" in the control log, durably,
     fenced against any newer driver (eos.protocol.decision);
  5. commit: the driver commits what any session can commit (PostgreSQL) and releases the
     owners of the others (Kafka producers in the Python workers), then waits for every commit;
  6. return: Spark writes its commit log (mark committed) and the sources publish progress.
Any failure before 4 aborts the attempt; after 4 the decision stands. Either way recovery runs
(eos.protocol.recovery: fence, resolve, re-read the ledgers) and the epoch is retried, up to
`tolerable_failures` consecutive failed attempts. A slot that committed writes nothing again.
An attempt that failed asking for a poison decision (eos.protocol.poison) has it recorded in the
checkpoint before the next attempt, which routes by it; that attempt counts as progress.

Recovery after a crash is the same recovery at start-up: Spark replays the last logged but
uncommitted epoch with the same offsets and state.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from eos.errors import (
    DriverFenced,
    EosError,
    EpochFailed,
    Permanent,
    PoisonDecision,
    SlotAborted,
    SourceFailed,
    from_spark,
)
from eos.failpoints import Failpoints
from eos.protocol import poison, recovery
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState, Decision, Pool
from eos.protocol.ledger import Ledger, committed_slots
from eos.protocol.plan import EpochPlan, SinkPlan
from eos.protocol.report import (
    COMMIT,
    DECIDE,
    WRITE,
    AttemptVotes,
    EpochListener,
    EpochReport,
    RecoveryReport,
    SlotReport,
)
from eos.protocol.sink import PipelineInfo, Prepared, Recovery, SinkConnector
from eos.protocol.slot import EPOCH_PROPERTY, SlotFunction, epoch_property

log = logging.getLogger("eos.protocol")


_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Failure)): (.+)$")


def reason_of(exc: BaseException) -> str:
    """The line a user should see for a failed attempt: the typed eos error it carries, else the
    innermost Python exception Spark quotes (its traceback's last line), else the first line."""
    typed = exc if isinstance(exc, EosError) else from_spark(exc)
    if typed is not None:
        return typed.message
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    raised = [m for m in (_RAISED.match(line) for line in lines) if m and "Py4JJavaError" not in m.group(1)]
    if raised:
        last = raised[-1]
        return f"{last.group(1)}: {last.group(2)[:300]}"
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


class EpochCommitter:
    def __init__(
        self,
        spark: Any,
        pipeline: PipelineInfo,
        sinks: list[SinkConnector],
        plans: tuple[SinkPlan, ...],
        checkpoint: Checkpoint,
        config_digest: str,
        control: ControlLog | None,
        coordinator: Coordinator | None,
        pools: dict[str, Pool],
        tolerable_failures: int,
        taken_over: ControlState | None = None,
        min_pause_s: float = 0.0,
        failpoints: Failpoints | None = None,
        listeners: Iterable[EpochListener] = (),
        run: str | None = None,
        meta: CheckpointMeta | None = None,
    ):
        self.spark = spark
        self.pipeline = pipeline
        self.sinks = sinks
        self.by_name = {sink.name: sink for sink in sinks}
        self.plans = plans
        self.checkpoint = checkpoint
        self.config_digest = config_digest
        self.control = control
        self.coordinator = coordinator
        self.pools = dict(pools)
        self.tolerable_failures = tolerable_failures
        self.min_pause_s = min_pause_s
        self.failpoints = failpoints or Failpoints()
        self.listeners = list(listeners)
        self.run = run or uuid.uuid4().hex[:12]
        self.meta = meta  # where poison decisions are recorded (written to the checkpoint as they grow)
        # The control log's last decision, as recovery resumes it. Known without reading the log
        # when the take-over read it (`taken_over`: from then on only this driver writes there)
        # and after this driver recorded one; unknown while a recording's outcome is.
        self.decision: Decision | None = taken_over.decision if taken_over is not None else None
        self.decision_known = taken_over is not None
        self.ledger: Ledger = {}
        self.consecutive_failures = 0
        self.last_epoch_end = 0.0
        self.busy = threading.Lock()  # held while an epoch runs: graceful stop waits on it
        self.stop_requested = False
        self.fatal_error: EosError | None = None
        self.slots = SlotFunction()  # every epoch's job runs this function (made once)

    @property
    def timeout_s(self) -> float:
        return self.pipeline.epoch_timeout_s

    def _emit(self, method: str, *args: Any) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, method)(*args)
            except Exception:  # observers must never break the protocol
                log.exception("listener %s.%s failed", type(listener).__name__, method)

    # -- recovery ------------------------------------------------------------------------------
    def grow(self, sizes: dict[str, int]) -> None:
        """The vote service hands out ids beyond a pool's recorded size: record it first."""
        pools = dict(self.pools)
        for name, size in sizes.items():
            if name in self.by_name and (name not in pools or pools[name].size != size):
                pools[name] = self.by_name[name].pool(size)
        assert self.control is not None
        self.control.record_pools(pools)
        self.pools = pools

    def recover(self, reason: str) -> RecoveryReport:
        if self.pipeline.exactly_once and self.control is not None:
            # First make sure this driver still holds the pipeline (re-recording its pools is a
            # write under its driver id: DriverFenced if a newer driver took over). A driver that
            # stalled while another took over must stop here: its recovery would fence the new
            # driver's transactions and read the new driver's ledger entries as its own.
            self.control.record_pools(self.pools)
            if not self.decision_known:  # the recorded one: what RESUME sinks resume
                self.decision = self.control.decision()
                self.decision_known = True
        if not self.pipeline.exactly_once:
            report = RecoveryReport(0, {}, 0.0, {}, reason)
        else:
            report = recovery.recover(
                self.sinks, self.pools, self.decision, self.checkpoint, self.pipeline.checkpoint_id,
                max(60.0, self.timeout_s), reason,
            )  # fmt: skip
        if self.coordinator is not None:
            # Every id is fenced now: none is owned. Pools of sinks no longer configured stay
            # recorded (and fenced at every recovery) but are never handed out.
            self.coordinator.set_pools({name: pool.size for name, pool in self.pools.items() if name in self.by_name})
        self.ledger = report.ledger
        self._emit("on_recovery", report)
        return report

    # -- one epoch -----------------------------------------------------------------------------
    def __call__(self, df: Any, epoch: int) -> None:
        with self.busy:
            self._run_epoch(df, epoch)

    def _run_epoch(self, df: Any, epoch: int) -> None:
        self.failpoints.hit("epoch.after_offsets_logged", epoch)
        pause = self.min_pause_s - (time.monotonic() - self.last_epoch_end)
        if self.last_epoch_end and pause > 0:
            time.sleep(pause)
        offsets = self.checkpoint.offsets_digest(epoch)
        attempt = 0
        while True:
            attempt += 1
            self._emit("on_epoch_start", epoch, attempt)
            plan = self._plan(epoch, attempt, offsets)
            try:
                report = self._attempt(df, plan)
            except BaseException as exc:
                self._abandon(plan, "the attempt failed")
                reason = reason_of(exc)
                typed = exc if isinstance(exc, EosError) else from_spark(exc)
                try:
                    progress = isinstance(typed, PoisonDecision) and self._record_poison(epoch, typed)
                except SourceFailed as refused:
                    typed, reason, progress = refused, refused.message, False
                if isinstance(typed, Permanent):
                    self._emit("on_epoch_aborted", epoch, attempt, reason, False)
                    self._settle()
                    raise type(typed)(f"epoch {epoch}: {typed.message}", typed.hint) from None
                if not isinstance(exc, Exception):
                    raise
                if not progress:
                    self.consecutive_failures += 1
                retrying = self.consecutive_failures <= self.tolerable_failures
                self._emit("on_epoch_aborted", epoch, attempt, reason, retrying)
                if not retrying:
                    self._settle()
                    raise EpochFailed(
                        f"epoch {epoch} failed {self.consecutive_failures} consecutive times "
                        f"(tolerable_failures: {self.tolerable_failures}); last error: {reason}"
                    ) from exc
                self._recover_between_attempts(epoch, attempt)
                continue
            self.consecutive_failures = 0
            report.attempts = attempt
            self._emit("on_epoch_committed", report)
            self.failpoints.hit("epoch.after_commit", epoch)
            self.last_epoch_end = time.monotonic()
            return

    def _plan(self, epoch: int, attempt: int, offsets: str) -> EpochPlan:
        return EpochPlan(
            pipeline=self.pipeline,
            epoch=epoch,
            attempt=attempt,
            run=self.run,
            offsets=offsets,
            config=self.config_digest,
            sinks=self.plans,
            skip=committed_slots(self.ledger, epoch, offsets, self.config_digest),
            coordinator=self.coordinator.address if self.coordinator else None,
            timeout_s=self.timeout_s,
            failpoints=self.failpoints,
        )

    def _record_poison(self, epoch: int, asked: PoisonDecision) -> bool:
        """Record the poison decisions a task asked for, durably, before the next attempt
        (eos.protocol.poison). True if any is new. Refused for an epoch whose commit decision is
        recorded: its committed part read those records without the decision, so routing them by
        it now would split the epoch between two routes (the source's answer changed since: for
        a registry, a schema it served is gone)."""
        if self.meta is None:
            return False
        new = set(asked.decisions) - set(self.meta.poison.get(asked.source, ()))
        if not new:
            return False
        if self.decision is not None and self.decision.epoch == epoch:
            raise SourceFailed(
                f"{asked.message}; but epoch {epoch} is already partly committed, and it read those records "
                "without this decision: routing them as poison now would split the epoch between two routes",
                hint="what the source's answer rests on changed after the epoch was decided (see above): restore "
                "it, then start the pipeline again",
            )
        poison.add(self.meta.poison, asked.source, sorted(new))
        self.checkpoint.write_meta(self.meta)
        log.warning("epoch %d: recorded poison decisions for source %s: %s", epoch, asked.source, sorted(new))
        return True

    def _abandon(self, plan: EpochPlan, reason: str) -> None:
        """The attempt is over without (complete) success: owners still waiting abort, and
        listeners learn what it had pre-committed."""
        if self.coordinator is None:
            return
        self.coordinator.close_attempt(plan.epoch, plan.attempt, reason)
        votes = self.coordinator.votes(plan.epoch, plan.attempt)
        prepared: dict[int, dict[str, int]] = defaultdict(dict)
        for vote in votes:
            prepared[vote.slot][vote.sink] = vote.records
        committed = frozenset(v.slot for v in votes if v.committed)
        self._emit("on_attempt_failed", AttemptVotes(plan.epoch, plan.attempt, dict(prepared), committed))

    def _settle(self) -> None:
        """The pipeline stops on a failed epoch: end the prepared transactions that would otherwise
        hold their locks until the next start (sinks that can resolve them from the driver; Kafka's
        open transactions end at their timeout, or at the next start's fencing). Best effort."""
        if not self.pipeline.exactly_once or self.control is None:
            return
        try:
            decision = self.control.decision()
            for (kind, _), group in recovery.by_system(self.sinks).items():
                if kind.recovery is Recovery.RESUME:
                    kind.resolve(group, decision)
        except Exception as exc:
            log.warning("could not resolve prepared transactions before stopping: %s", exc)

    def _recover_between_attempts(self, epoch: int, attempt: int) -> None:
        """Fence, resolve and re-read the ledgers before the next attempt. A system may be
        restarting: a failed recovery counts against the same tolerance, with a growing pause."""
        while True:
            try:
                self.recover(f"epoch {epoch} attempt {attempt} failed")
                return
            except Permanent:
                raise
            except EosError as exc:
                if not isinstance(exc, SlotAborted):
                    raise
                problem: Exception = exc
            except Exception as exc:
                problem = exc
            self.consecutive_failures += 1
            reason = f"recovery failed: {reason_of(problem)}"
            retrying = self.consecutive_failures <= self.tolerable_failures
            self._emit("on_epoch_aborted", epoch, attempt, reason, retrying)
            if not retrying:
                raise EpochFailed(f"epoch {epoch}: {reason} (tolerable_failures: {self.tolerable_failures})")
            time.sleep(min(30.0, 2.0**self.consecutive_failures))

    def _attempt(self, df: Any, plan: EpochPlan) -> EpochReport:
        if self.coordinator is not None:
            self.coordinator.open_attempt(plan.epoch, plan.attempt, self.timeout_s)
        started = time.perf_counter()
        self._emit("on_phase", plan.epoch, plan.attempt, WRITE)
        reports = self._run_job(df, plan)
        job_s = time.perf_counter() - started
        prepared = [p for r in reports for p in r.prepared()] if self.pipeline.exactly_once else []
        decide_s = commit_s = 0.0
        if self.pipeline.exactly_once and prepared:
            by_sink: dict[str, list[Prepared]] = defaultdict(list)
            for p in prepared:
                by_sink[p.sink].append(p)
            for sink, items in by_sink.items():
                self.by_name[sink].agree(items)
            decided = time.perf_counter()
            self._emit("on_phase", plan.epoch, plan.attempt, DECIDE)
            self._decide(plan, prepared)
            decide_s = time.perf_counter() - decided
            committing = time.perf_counter()
            self._emit("on_phase", plan.epoch, plan.attempt, COMMIT)
            self._commit(plan, prepared)
            commit_s = time.perf_counter() - committing
        if self.coordinator is not None:
            strays = self.coordinator.close_attempt(plan.epoch, plan.attempt, "finished")
            if strays or any(r.task_attempt > 0 for r in reports):
                self._sweep(strays)
        return self._report(plan, reports, job_s, decide_s, commit_s, len(prepared))

    def _sweep(self, strays: list[Any]) -> None:
        """Pre-commits of task attempts Spark retried (their results were not taken): nobody will
        commit them, and an open transaction holds up readers (Kafka's last stable offset, row
        locks) until it is aborted. Their owners were told to abort; make sure of it."""
        by_sink: dict[str, list[Prepared]] = defaultdict(list)
        for vote in strays:
            by_sink[vote.sink].append(
                Prepared(vote.sink, vote.slot, vote.handle, 0, vote.task_attempt, {"lease": vote.lease})
            )
        for sink, items in by_sink.items():
            self.by_name[sink].discard(items)
        for (kind, _), group in recovery.by_system(self.sinks).items():
            if kind.recovery is Recovery.RESUME:
                kind.resolve(group, self.decision)

    def _run_job(self, df: Any, plan: EpochPlan) -> list[SlotReport]:
        sc = self.spark.sparkContext
        tag = f"eos-{self.pipeline.name}-{plan.epoch}-{plan.attempt}-{uuid.uuid4().hex[:6]}"
        # A task that hangs (a stalled read, a stuck broker) ends with the attempt.
        timed_out = threading.Event()

        def cancel() -> None:
            timed_out.set()
            sc.cancelJobsWithTag(tag)

        watchdog = threading.Timer(self.timeout_s, cancel)
        watchdog.daemon = True
        sc.addJobTag(tag)
        # The recorded poison decisions reach the read tasks with the job (eos.protocol.poison).
        sc.setLocalProperty(poison.PROPERTY, poison.job_property(self.meta.poison) if self.meta else None)
        sc.setLocalProperty(EPOCH_PROPERTY, epoch_property(plan))
        watchdog.start()
        try:
            rows = self.slots.apply(df, plan).collect()
        except Exception:
            if timed_out.is_set():
                raise SlotAborted(
                    f"epoch {plan.epoch} attempt {plan.attempt} timed out: its Spark job ran longer than "
                    f"epochs.timeout ({self.timeout_s:.0f} s) and was cancelled"
                ) from None
            raise
        finally:
            watchdog.cancel()
            sc.removeJobTag(tag)
            sc.setLocalProperty(poison.PROPERTY, None)
            sc.setLocalProperty(EPOCH_PROPERTY, None)
        reports = [SlotReport.from_json(row.report) for row in rows]
        slots = sorted(r.slot for r in reports)
        if slots != list(range(len(slots))):
            raise SlotAborted(f"epoch {plan.epoch}: expected one report per slot, got slots {slots}")
        return reports

    def _decide(self, plan: EpochPlan, prepared: list[Prepared]) -> None:
        handles: dict[str, list[str]] = defaultdict(list)
        for p in prepared:
            handles[p.sink].append(p.handle)
        decision = Decision(plan.epoch, plan.attempt, self.run, dict(handles))
        assert self.control is not None
        self.decision_known = False  # until it is recorded: a failed recording may still have landed
        try:
            self.control.record_decision(decision)
        except DriverFenced as exc:
            self.fatal_error = exc
            raise
        self.decision, self.decision_known = decision, True

    def _commit(self, plan: EpochPlan, prepared: list[Prepared]) -> None:
        """Step 5. Slot by slot while the `sink.between_commits` failpoint is armed (so a crash can
        land between two slots' commits), all at once otherwise."""
        assert self.coordinator is not None
        owned = {p.sink: self.by_name[p.sink].recovery is Recovery.REPLAY for p in prepared}
        ordered = self.failpoints.armed("sink.between_commits")
        batches = [[p] for p in sorted(prepared, key=lambda p: (p.slot, p.sink))] if ordered else [prepared]
        for batch in batches:
            keys = [(p.sink, p.handle) for p in batch if owned[p.sink]]
            self.coordinator.release(plan.epoch, plan.attempt, keys)
            by_sink: dict[str, list[Prepared]] = defaultdict(list)
            for p in batch:
                if not owned[p.sink]:
                    by_sink[p.sink].append(p)
            for sink, items in by_sink.items():
                for p in items:
                    self.failpoints.hit("sink.after_agreement", plan.epoch, p.slot, plan.attempt)
                self.by_name[sink].commit(items)
                for p in items:
                    self.failpoints.hit("sink.between_commits", plan.epoch, p.slot, plan.attempt)
            problems = self.coordinator.wait_committed(plan.epoch, plan.attempt, keys, self.timeout_s)
            if problems:
                raise SlotAborted(f"epoch {plan.epoch}: commit failed after the decision: {'; '.join(problems)}")

    def _report(
        self, plan: EpochPlan, reports: list[SlotReport], job_s: float, decide_s: float, commit_s: float, txns: int
    ) -> EpochReport:
        records: dict[str, int] = defaultdict(int)
        skipped: dict[str, int] = defaultdict(int)
        counted: dict[str, int] = defaultdict(int)
        writers = {p.name: p.writer is not None for p in plan.sinks}
        for report in reports:
            for sink, work in report.sinks.items():
                if not writers[sink]:
                    counted[sink] += work.skipped
                    continue
                records[sink] += work.records
                if work.skipped:
                    skipped[sink] += work.skipped
        return EpochReport(
            epoch=plan.epoch,
            attempts=plan.attempt,
            records_out=dict(records),
            replay_skipped=dict(skipped),
            skipped_slots=len(plan.skip),
            counted_only=dict(counted),
            job_s=job_s,
            decide_s=decide_s,
            commit_s=commit_s,
            slots=reports,
            txn_commits=txns,
        )

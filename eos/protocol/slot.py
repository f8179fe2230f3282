"""Step 2, pre-commit, and the task side of steps 3-4: one slot of one epoch attempt, in a Spark
task (a Python worker), and the thread that commits after the task has returned.

For each sink whose rows reach this slot (and whose ledger entry is older than the epoch):
open a writer (begin a transaction), write the rows, pre-commit with the slot's ledger entry
inside the same transaction. Then vote:
- a sink the driver commits (PostgreSQL: COMMIT PREPARED works from any session) needs nothing
  more from the task: the prepared handle travels in the slot's report;
- a sink only this process can commit (Kafka: the producer that pre-committed must commit) sends
  its `prepared` vote and hands the connection to a thread of this Python worker, which waits
  for the decision and commits or aborts. The task itself returns at once: the slots of an
  epoch need not run at the same time (no barrier stage, any number of slots on any number of
  cores), and a worker's producers stay alive in it from epoch to epoch.
PySpark reuses its Python workers between tasks (spark.python.worker.reuse, on by default), so
the thread outlives the task; if the worker dies first, its transaction is never committed and
the driver, missing the commit report, fails the attempt and replays that slot (the ledger
says it did not commit).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from eos.errors import SlotAborted, crossing
from eos.protocol.channel import COMMIT, MAX_IDLE, VoteClient
from eos.protocol.ledger import LedgerEntry
from eos.protocol.plan import SINK_TAG, EpochPlan, SinkPlan, sink_column
from eos.protocol.report import SinkWork, SlotReport
from eos.protocol.sink import Lease, SlotContext, SlotWriter

# The job's local property that tells its tasks which epoch attempt they write (JSON, no secret:
# Spark's event log keeps a job's properties). What does not change from epoch to epoch (the
# sinks' writers and their clients, the vote service's key) is pickled into the job's function,
# made once (SlotFunction): a new function per epoch cost ~10 ms of every epoch (pickling it,
# registering it in the JVM, parsing its schema there).
EPOCH_PROPERTY = "eos.epoch"
# Identifies this Python worker process across tasks (a pid alone can be reused).
WORKER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class TaskContext(SlotContext):
    def __init__(self, plan: EpochPlan, sink: SinkPlan, slot: int, task_attempt: int):
        self.plan = plan
        self.pipeline = plan.pipeline
        self.sink = sink.name
        self.slot = slot
        self.epoch = plan.epoch
        self.attempt = plan.attempt
        self.task_attempt = task_attempt
        self.worker = _worker_id()
        self.vote: VoteClient | None = None
        self.lease_s = 0.0

    def lease(self, idle: list[int]) -> Lease:
        if self.plan.coordinator is None:
            raise SlotAborted(f"sink {self.sink}: transactional ids need the vote service (exactly-once mode)")
        started = time.perf_counter()
        self.vote = self.vote or VoteClient(self.plan.coordinator, self.epoch, self.attempt, self.plan.timeout_s)
        # Ids not offered stay this worker's until another lease takes one (then it learns it is stale).
        offered = idle[:MAX_IDLE]
        reply = self.vote.request("lease", sink=self.sink, slot=self.slot, worker=self.worker, idle=offered)
        self.lease_s += time.perf_counter() - started
        if "number" not in reply:
            raise SlotAborted(f"sink {self.sink} slot {self.slot}: no transactional id granted: {reply.get('error')}")
        return Lease(int(reply["number"]), bool(reply["fresh"]), tuple(int(n) for n in reply.get("stale", [])))

    def hit(self, point: str) -> None:
        self.plan.failpoints.hit(point, self.epoch, self.slot, self.attempt)


def _worker_id() -> str:
    # A forked worker inherits the module of its parent: recompute when the pid changed.
    global WORKER
    if f":{os.getpid()}:" not in WORKER:
        WORKER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return WORKER


def epoch_property(plan: EpochPlan) -> str:
    """EPOCH_PROPERTY's value for `plan`'s job."""
    fields = {"pipeline": plan.pipeline.name, "run": plan.run, "epoch": plan.epoch, "attempt": plan.attempt}
    return json.dumps({**fields, "offsets": plan.offsets, "skip": sorted(plan.skip)})


def unchanging(plan: EpochPlan) -> EpochPlan:
    """What of `plan` stays the same from epoch to epoch (the rest travels in EPOCH_PROPERTY)."""
    return replace(plan, epoch=-1, attempt=0, offsets="", skip=frozenset())


def task_plan(base: EpochPlan, text: str | None) -> EpochPlan:
    """The task's plan: `base` (pickled into the job's function) with its job's EPOCH_PROPERTY.
    Refused, never guessed, when the job does not say, or says it for another pipeline or run."""
    if not text:
        raise SlotAborted(f"pipeline {base.pipeline.name}: a slot task ran in a job that has no {EPOCH_PROPERTY}")
    said = json.loads(text)
    if (said["pipeline"], said["run"]) != (base.pipeline.name, base.run):
        raise SlotAborted(
            f"pipeline {base.pipeline.name} run {base.run}: a slot task ran in a job of pipeline {said['pipeline']} "
            f"run {said['run']}"
        )
    skip = frozenset((str(sink), int(slot)) for sink, slot in said["skip"])
    return replace(base, epoch=int(said["epoch"]), attempt=int(said["attempt"]), offsets=said["offsets"], skip=skip)


class SlotFunction:
    """The Python function of every epoch's job (one task = one slot), made again only when what
    it holds changes (unchanging(plan)). It is pickled once, so what it holds must not change in
    place while the run lasts: the plans and the sinks' writer factories are frozen dataclasses."""

    def __init__(self) -> None:
        self.base: EpochPlan | None = None
        self.udf: Any = None
        self.columns: tuple[str, ...] = ()
        self.call: Any = None  # the function applied to `columns`, by name (each epoch's rows have the same)

    def apply(self, df: Any, plan: EpochPlan) -> Any:
        """`df.mapInArrow(slot_task(...), "slot int, report string")`, with the function made
        once. The job that runs it must carry EPOCH_PROPERTY (epoch_property(plan))."""
        from pyspark.rdd import PythonEvalType
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.functions import pandas_udf
        from pyspark.sql.types import IntegerType, StringType, StructField, StructType

        base, columns = unchanging(plan), tuple(df.columns)
        if self.udf is None or base != self.base:
            schema = StructType([StructField("slot", IntegerType()), StructField("report", StringType())])
            kind = PythonEvalType.SQL_MAP_ARROW_ITER_UDF
            self.udf = pandas_udf(slot_task(base), returnType=schema, functionType=kind)  # type: ignore[call-overload]
            self.base, self.call = base, None
        if self.call is None or columns != self.columns:
            self.call = self.udf(*[F.col("`" + name.replace("`", "``") + "`") for name in columns])
            self.columns = columns
        # DataFrame.mapInArrow, with this function instead of a new one (classic PySpark, as eos is).
        return DataFrame(df._jdf.mapInArrow(self.call._jc, False, None), df.sparkSession)


def slot_task(base: EpochPlan):
    """The function for `mapInArrow`: one task = one slot; yields the slot's report."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext as SparkTask

        task = SparkTask.get()
        with crossing():
            plan = task_plan(base, task.getLocalProperty(EPOCH_PROPERTY))
            report = write_slot(plan, task.partitionId(), task.attemptNumber(), batches)
        yield pa.RecordBatch.from_arrays(
            [pa.array([report.slot], pa.int32()), pa.array([report.to_json()], pa.string())], names=["slot", "report"]
        )

    return run


def _by_sink(batch: Any) -> Iterator[tuple[int, Any]]:
    import pyarrow.compute as pc

    tags = batch.column(SINK_TAG)
    first = tags[0].as_py()
    if pc.all(pc.equal(tags, first)).as_py():  # the usual case: a slot is a partition of one sink's rows
        yield first, batch
        return
    for index in pc.unique(tags).to_pylist():
        yield index, batch.filter(pc.equal(tags, index))


def write_slot(plan: EpochPlan, slot: int, task_attempt: int, batches: Iterator[Any]) -> SlotReport:
    import pyarrow as pa

    started = time.perf_counter()
    report = SlotReport(slot, task_attempt, _worker_id(), socket.gethostname(), os.getpid())
    open_writers: dict[int, tuple[TaskContext, SlotWriter]] = {}
    try:
        wrote = False
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for index, rows in _by_sink(batch):
                sink = plan.sinks[index]
                work = report.sinks.setdefault(sink.name, SinkWork(by_owner=sink.by_owner))
                if sink.writer is None or (sink.name, slot) in plan.skip:
                    work.skipped += rows.num_rows
                    continue
                if index not in open_writers:
                    ctx = TaskContext(plan, sink, slot, task_attempt)
                    open_started = time.perf_counter()
                    open_writers[index] = (ctx, sink.writer.open(ctx))
                    work.init_s = time.perf_counter() - open_started
                    work.reused = getattr(open_writers[index][1], "reused", False)
                open_writers[index][1].write(pa.RecordBatch.from_struct_array(rows.column(sink_column(index))))
                work.records += rows.num_rows
                if not wrote:
                    wrote = True
                    plan.failpoints.hit("sink.mid_produce", plan.epoch, slot, plan.attempt)
        report.write_s = time.perf_counter() - started

        precommit_started = time.perf_counter()
        for index, (_ctx, writer) in open_writers.items():
            sink = plan.sinks[index]
            entry = LedgerEntry(
                pipeline=plan.pipeline.name, sink=sink.name, slot=slot, epoch=plan.epoch,
                checkpoint=plan.pipeline.checkpoint_id, offsets=plan.offsets, config=plan.config,
                attempt=plan.attempt, run=plan.run, records=report.sinks[sink.name].records, written_at=time.time(),
            )  # fmt: skip
            report.sinks[sink.name].prepared = writer.precommit(entry)
        report.precommit_s = time.perf_counter() - precommit_started
        for point in ("sink.after_precommit",) + (() if plan.exactly_once else ("sink.after_agreement",)):
            plan.failpoints.hit(point, plan.epoch, slot, plan.attempt)
        if plan.exactly_once:
            for index, (ctx, writer) in open_writers.items():
                if plan.sinks[index].by_owner:
                    _hand_over(ctx, writer, report.sinks[plan.sinks[index].name])
        else:  # no vote and no commit: the records are visible already
            plan.failpoints.hit("sink.between_commits", plan.epoch, slot, plan.attempt)
        return report
    except BaseException:
        for ctx, writer in open_writers.values():
            _abort_quietly(writer)
            if ctx.vote is not None:
                ctx.vote.close()
        raise


def _hand_over(ctx: TaskContext, writer: SlotWriter, work: SinkWork) -> None:
    """Vote `prepared` and leave the commit to a thread of this worker (see the module doc)."""
    prepared = work.prepared
    assert prepared is not None and ctx.plan.coordinator is not None
    vote = ctx.vote or VoteClient(ctx.plan.coordinator, ctx.epoch, ctx.attempt, ctx.plan.timeout_s)
    ctx.vote = None
    thread = threading.Thread(
        target=_await_and_commit, args=(ctx, vote, writer, prepared), name=f"eos-commit-{ctx.sink}-{ctx.slot}"
    )
    thread.daemon = True
    thread.start()


def _await_and_commit(ctx: TaskContext, vote: VoteClient, writer: SlotWriter, prepared: Any) -> None:
    fields = {"sink": prepared.sink, "handle": prepared.handle, "slot": ctx.slot, "task_attempt": ctx.task_attempt,
              "lease": prepared.detail.get("lease"), "records": prepared.records}  # fmt: skip
    try:
        reply = vote.request("prepared", **fields)
        if reply.get("decision") != COMMIT:
            _abort_quietly(writer)
            return
        ctx.hit("sink.after_agreement")
        try:
            writer.commit()
        except Exception as exc:
            # In the executor's log: a zombie that wakes up after a newer attempt fenced its
            # transactional id ends here, and nothing it wrote becomes visible.
            print(f"eos: commit of {prepared.handle} refused: {exc}", file=sys.stderr, flush=True)
            vote.request("commit_failed", **fields, error=f"{type(exc).__name__}: {exc}"[:500])
            return
        ctx.hit("sink.between_commits")
        vote.request("committed", **fields)
    finally:
        vote.close()


def _abort_quietly(writer: SlotWriter) -> None:
    with contextlib.suppress(Exception):  # best effort: recovery fences whatever is left
        writer.abort()

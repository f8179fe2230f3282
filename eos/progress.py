"""Per-epoch progress for people, and Spark's own progress as events.

One line per committed epoch: records in (from Spark's progress) and out, rate, and the time
each protocol phase took. Recoveries and aborted attempts get a line of their own.
"""

from __future__ import annotations

import threading
import time
from typing import IO, Any

from pyspark.sql.streaming import StreamingQueryListener

from eos.protocol import EpochListener, EpochReport, RecoveryReport


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f}ms" if seconds < 0.1 else f"{seconds * 1000:.0f}ms"


class ProgressPrinter(EpochListener):
    def __init__(self, pipeline: str, out: IO[str]):
        self.pipeline = pipeline
        self.out = out
        self._lock = threading.Lock()
        self._reports: dict[int, EpochReport] = {}
        self._started = time.monotonic()

    def _print(self, line: str) -> None:
        print(f"[{self.pipeline}] {line}", file=self.out, flush=True)

    def on_recovery(self, report: RecoveryReport) -> None:
        slots = ", ".join(f"{sink}/{slot}:{entry.epoch}" for (sink, slot), entry in sorted(report.ledger.items()))
        self._print(
            f"recovery ({report.reason}): fenced {report.fenced_ids} transactional ids in {_ms(report.fence_s)}; "
            f"ledger: {slots or 'empty'}"
        )

    def on_epoch_aborted(self, epoch: int, attempt: int, reason: str, retrying: bool) -> None:
        then = "retrying after fencing" if retrying else "giving up"
        self._print(f"epoch {epoch} attempt {attempt} ABORTED: {reason}; {then}")

    def on_epoch_committed(self, report: EpochReport) -> None:
        with self._lock:
            self._reports[report.epoch] = report

    def on_spark_progress(self, progress: dict[str, Any]) -> None:
        with self._lock:
            report = self._reports.pop(progress.get("batchId", -1), None)
        if report is not None:
            self._line(report, progress)

    def flush(self) -> None:
        with self._lock:
            pending, self._reports = self._reports, {}
        for report in sorted(pending.values(), key=lambda r: r.epoch):
            self._line(report, None)

    def _line(self, report: EpochReport, progress: dict[str, Any] | None) -> None:
        out = sum(report.records_out.values())
        records_in = progress.get("numInputRows") if progress else None
        durations = (progress or {}).get("durationMs", {})
        total_s = durations.get("triggerExecution", report.job_s * 1000) / 1000
        rate = (records_in if records_in is not None else out) / total_s if total_s > 0 else 0.0
        plan_ms = sum(durations.get(k, 0) for k in ("latestOffset", "walCommit", "queryPlanning", "getBatch"))
        extras = []
        if report.replay_skipped or report.skipped_slots:
            extras.append(f"replay: {report.skipped_slots} slot(s) already committed, skipped")
        if report.counted_only:
            extras.append(f"poison skipped: {sum(report.counted_only.values())}")
        if report.attempts > 1:
            extras.append(f"attempts {report.attempts}")
        self._print(
            f"epoch {report.epoch} committed | in {records_in if records_in is not None else '?'} | out {out} | "
            f"{rate:,.0f} rec/s | plan {plan_ms:.0f}ms read+process {_ms(report.read_process_s)} "
            f"pre-commit {_ms(report.precommit_s)} agree {_ms(report.agreement_s)} "
            f"(wait {_ms(report.vote_wait_s)}) commit {_ms(report.commit_s)}"
            + (f" | {'; '.join(extras)}" if extras else "")
        )


class SparkProgressBridge(StreamingQueryListener):
    """Forwards Spark's per-batch progress (a dict) to every listener with on_spark_progress."""

    def __init__(self, listeners: list[EpochListener]):
        self.listeners = listeners

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        import json

        progress = json.loads(event.progress.json)
        for listener in self.listeners:
            handler = getattr(listener, "on_spark_progress", None)
            if handler is not None:
                handler(progress)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

"""The handle of a running pipeline, in PySpark's idiom: `awaitTermination()`, `stop()`,
`lastProgress`, `status`, `isActive`, `exception()`, plus what eos counted (`epochs_committed`,
`records_out`).

`stop()` is graceful: the epoch in flight finishes (it commits, or is left pending for the next
start to replay), then the query stops. A failure surfaces from `awaitTermination()` as an
`eos.errors.EosError` (its message says what failed and what to do), never as Spark's wrapped
exception. When the query ends, for whatever reason, the handle releases what the run held: the
vote service, the control log's producer, the metrics endpoint, the connectors' clients.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eos.errors import CheckpointError, EosError, EpochFailed, Permanent, from_spark
from eos.protocol.committer import EpochCommitter
from eos.protocol.report import EpochListener

log = logging.getLogger("eos.query")

# Started and not ended yet, in this process: what a JVM shutdown stops first (eos.jvmstop).
_running: weakref.WeakSet[EosQuery] = weakref.WeakSet()


def running() -> list[EosQuery]:
    return list(_running)


STOP_MARKER = "eos graceful stop"


class StopRequested(RuntimeError):
    """Raised into Spark when a stop was requested as a new epoch began: the epoch stays logged
    but uncommitted, and is replayed on the next start. Returning instead would let Spark mark
    it committed with nothing written."""


@dataclass
class RunResult:
    pipeline: str
    epochs_committed: int = 0
    records_out: dict[str, int] = field(default_factory=dict)
    stopped_by: str = "finished"


class Tally(EpochListener):
    def __init__(self, result: RunResult):
        self.result = result

    def on_epoch_committed(self, report: Any) -> None:
        self.result.epochs_committed += 1
        for sink, n in report.records_out.items():
            self.result.records_out[sink] = self.result.records_out.get(sink, 0) + n


def guarded(committer: EpochCommitter) -> Callable[[Any, int], None]:
    """foreachBatch function: remembers our own exception (Spark re-wraps it) and honours stops."""

    def run_epoch(df: Any, epoch: int) -> None:
        if committer.stop_requested:
            raise StopRequested(STOP_MARKER)
        try:
            committer(df, epoch)
        except EosError as exc:
            committer.fatal_error = exc
            raise

    return run_epoch


class EosQuery:
    """A started pipeline (see the module doc)."""

    def __init__(
        self,
        query: Any,
        committer: EpochCommitter | None,
        result: RunResult,
        epoch_timeout_s: float,
        on_end: Callable[[Any], None],
    ):
        self._query = query
        self._committer = committer
        self.result = result
        self._epoch_timeout_s = epoch_timeout_s
        self._on_end = on_end
        self._ended = threading.Lock()
        self._done = query is None
        self._error: EosError | None = None
        self._stopping = False
        if not self._done:
            _running.add(self)

    # -- PySpark's StreamingQuery, by name ---------------------------------------------------
    @property
    def id(self) -> str | None:
        return self._query.id if self._query is not None else None

    @property
    def runId(self) -> str | None:
        return self._query.runId if self._query is not None else None

    @property
    def name(self) -> str:
        return self._query.name if self._query is not None else f"eos-{self.result.pipeline}"

    @property
    def isActive(self) -> bool:
        return self._query is not None and not self._done and bool(self._query.isActive)

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self._query.lastProgress if self._query is not None else None

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return self._query.recentProgress if self._query is not None else []

    @property
    def status(self) -> dict[str, Any]:
        if self._query is None:
            return {"message": "Stopped", "isDataAvailable": False, "isTriggerActive": False}
        return self._query.status

    def exception(self) -> EosError | None:
        """The error the query ended with (None while it runs, or if it ended cleanly)."""
        return self._error

    # -- eos's counts -----------------------------------------------------------------------
    @property
    def epochs_committed(self) -> int:
        return self.result.epochs_committed

    @property
    def records_out(self) -> dict[str, int]:
        return dict(self.result.records_out)

    # -- waiting and stopping ---------------------------------------------------------------
    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait until the query ends (or `timeout` seconds pass: then returns whether it ended).
        Raises the EosError a failed query ended with."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left < 0.001:  # Spark takes whole milliseconds, and refuses 0
                return False
            try:
                ended = self._query.awaitTermination(left)
            except Exception as exc:
                self._end(self._translate(exc))
                break
            if ended:
                self._end(None)
                break
        if self._error is not None:
            raise self._error
        return True if timeout is not None else None

    def stop(self) -> None:
        """Finish the epoch in flight (it commits, or stays pending for the next start), then stop."""
        if self._done or self._query is None:
            return
        self.request_stop()
        if self._committer is not None and self._committer.busy.acquire(timeout=self._epoch_timeout_s + 30):
            self._committer.busy.release()
        try:
            self._query.stop()
        except Exception as exc:  # the JVM got the signal too (a process-group kill) and stopped
            print(
                f"eos: Spark stopped on its own ({str(exc).splitlines()[0][:120]}); any epoch in flight is aborted "
                "and will be replayed on the next start",
                file=sys.stderr,
                flush=True,
            )
        with contextlib.suppress(EosError):  # kept in exception()
            self.awaitTermination()

    def request_stop(self) -> None:
        """Ask for a graceful stop without waiting (no new epoch starts)."""
        self._stopping = True
        if self._committer is not None:
            self._committer.stop_requested = True

    def abort(self) -> None:
        """Stop now: the epoch in flight is aborted and replayed on the next start."""
        self._stopping = True
        if self._query is not None:
            threading.Thread(target=self._query.stop, daemon=True).start()

    # -- internals ------------------------------------------------------------------------------
    def _translate(self, exc: BaseException) -> EosError | None:
        committer = self._committer
        if (self._stopping or (committer is not None and committer.stop_requested)) and STOP_MARKER in str(exc):
            return None
        if committer is not None and committer.fatal_error is not None:
            return committer.fatal_error
        typed = from_spark(exc)
        if typed is not None:
            # A typed error from inside Spark (a source's planning, a task): a Permanent one keeps its
            # type (and exit code); any other ended the query, which is an epoch that failed.
            return typed if isinstance(typed, Permanent) else EpochFailed(typed.message, typed.hint)
        return EpochFailed(f"the streaming query failed: {str(exc).splitlines()[0][:500]}")

    def _end(self, error: EosError | None) -> None:
        with self._ended:
            if self._done:
                return
            self._done = True
            self._error = error
            _running.discard(self)
            try:
                self._on_end(self._query)
            except Exception:
                log.exception("releasing the run's resources failed")


__all__ = ["STOP_MARKER", "CheckpointError", "EosQuery", "RunResult", "StopRequested", "Tally", "guarded"]

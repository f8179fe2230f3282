"""User-facing errors, and the one typed hierarchy that decides retry versus stop.

Every error eos raises on purpose is an `EosError`: it says what is wrong, where, and what to
do about it. The CLI prints it without a traceback and exits non-zero; anything else is a bug
and keeps its traceback.

When an epoch attempt fails, its *type* decides what happens next:
- `Retriable`: another attempt may succeed (a broker restarting, a fenced producer, a vote
  that timed out, a schema registry that lags). The attempt is aborted, recovery runs, and the
  epoch is retried up to `tolerable_failures` times.
- `Permanent`: no retry can help (a poison record under `on_error: fail`, a deleted topic,
  another driver took over). The pipeline stops at once with the message.
- anything else: treated as retriable (Spark task failures, lost executors).

Errors raised inside Spark tasks reach the driver only as text (Spark re-wraps them in its own
exceptions). `crossing()` therefore carries an `EosError` across that boundary as a one-line
JSON envelope, and `from_spark()` rebuilds the typed exception on the driver: the type is
decided where the error happened, never guessed from a message.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

from eos.workergc import freeze_new_imports


class EosError(Exception):
    """An error the user can act on.

    Its class decides the exit code of every eos command (docs/COMMANDS.md):
      1  the environment: a broker, topic, database, permission or the checkpoint's location is
         missing or unreachable, or an epoch kept failing (`EnvironmentProblem`, `EpochFailed`);
         trying again later, or fixing the system, can help;
      2  the pipeline file or the command line is wrong (`ConfigError`): fix the file;
      3  eos refused, to keep exactly-once: the checkpoint is another pipeline's or damaged, the
         config changed under a pending epoch, another driver runs, a record cannot be decoded
         under `on_error: fail` (`CheckpointError`, `Permanent`): a person must decide (the
         message's hint says how); retrying alone never helps.
    """

    exit_code = 1
    wire_fields: tuple[str, ...] = ()  # attributes that cross the task boundary with the message

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(EosError):
    """The pipeline file (or a command-line argument) is invalid."""

    exit_code = 2


class EnvironmentProblem(EosError):
    """Something outside eos is missing or broken: Java, Maven, a port, a broker, a database."""


class CheckpointError(EosError):
    """The checkpoint does not belong to this pipeline, is corrupt, or was changed unsafely."""

    exit_code = 3


class EpochFailed(EosError):
    """An epoch could not be committed within its allowed attempts."""


# ---------------------------------------------------------------------------------------------
# What a failed epoch attempt means
# ---------------------------------------------------------------------------------------------


class Retriable(EosError):
    """Another attempt of the epoch may succeed."""


class Permanent(EosError):
    """No retry can help: the pipeline stops with this message."""

    exit_code = 3


class PoisonRecord(Permanent):
    """A record cannot be decoded and the source says `on_error: fail`."""


class SourceFailed(Permanent):
    """A source cannot continue without the user's decision (topic deleted or recreated, offsets
    deleted before they were read)."""


class DriverFenced(Permanent):
    """Another driver took over this pipeline; this one must stop without committing."""


class SlotAborted(Retriable):
    """A sink slot gave up on its part of the epoch attempt (told to abort, fenced, timed out)."""


class DependencyUnavailable(Retriable):
    """A service a record's fate depends on (a schema registry) did not answer or lagged: the
    attempt fails rather than let an outage decide where a record goes."""


class PoisonDecision(Retriable):
    """A read task met records that only a recorded decision may route as poison (a schema id
    the registry definitively does not know). The driver records `decisions` for `source` in the
    checkpoint before the next attempt, which routes by them (eos.protocol.poison). They are the
    source's own strings: the core stores and hands them back, never reads them."""

    wire_fields = ("source", "decisions")

    def __init__(self, message: str, hint: str | None = None, source: str = "", decisions: list[str] | None = None):
        super().__init__(message, hint)
        self.source = source
        self.decisions = list(decisions or [])


# ---------------------------------------------------------------------------------------------
# Crossing the Spark task boundary
# ---------------------------------------------------------------------------------------------

_ENVELOPE = "EOS-ERROR"
_FOUND = re.compile(re.escape(_ENVELOPE) + r"(\{.*?\})" + re.escape(_ENVELOPE))
_TYPES: dict[str, type[EosError]] = {
    cls.__name__: cls
    for cls in (
        EosError, ConfigError, EnvironmentProblem, CheckpointError, EpochFailed, Retriable, Permanent, PoisonRecord,
        SourceFailed, DriverFenced, SlotAborted, DependencyUnavailable, PoisonDecision,
    )
}  # fmt: skip


def to_wire(error: EosError) -> str:
    """One line that survives Spark's re-wrapping and names the error's type."""
    fields = {name: getattr(error, name) for name in error.wire_fields}
    body = json.dumps({"type": type(error).__name__, "message": error.message, "hint": error.hint, **fields})
    return f"{_ENVELOPE}{body}{_ENVELOPE}"


class TaskError(RuntimeError):
    """An EosError raised inside a Spark task, as the wire envelope (see `crossing`)."""


@contextlib.contextmanager
def crossing() -> Iterator[None]:
    """Wrap task-side code: an EosError leaves the task as a TaskError carrying its envelope.
    Also where a Python worker keeps its imports out of the collection after each task
    (eos.workergc)."""
    freeze_new_imports()
    try:
        yield
    except EosError as error:
        raise TaskError(to_wire(error)) from None


def from_spark(error: BaseException) -> EosError | None:
    """The EosError a Spark/Py4J failure carries, rebuilt with its type; None if it carries none.
    Spark quotes a failure several times (task, stage, job): the first envelope is the cause."""
    for found in _FOUND.finditer(str(error)):
        try:
            data = json.loads(found.group(1))
        except json.JSONDecodeError:  # a quoted copy (escaped inside a plan string): try the next
            continue
        cls = _TYPES.get(data.get("type"), EosError)
        fields = {name: data[name] for name in cls.wire_fields if name in data}
        return cls(data.get("message", ""), data.get("hint"), **fields)
    return None


def is_permanent(error: BaseException) -> bool:
    return isinstance(error, Permanent) or isinstance(from_spark(error), Permanent)

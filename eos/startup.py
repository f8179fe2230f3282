"""Start-up checks that guard a checkpoint: whose it is, what it pins, and whether the pipeline
may change under its pending epoch.

A pipeline's start (eos.pipeline.Pipeline) goes through these in order:
  1. `open_checkpoint`: read the checkpoint's eos metadata (or plan to create it), check that it
     belongs to this pipeline and mode, that Spark's offset log is readable, and which epoch is
     pending;
  2. each source is checked against what the checkpoint pinned at its first start (the
     connector's `check_pin`), as it is declared;
  3. `settle`: once every source and sink is declared, the replay config (everything that
     decides what a replay writes) is compared with the pending epoch's;
  4. `check_changes_while_pending`: after the take-over has read the control log, a change is
     refused if the pending epoch may already have committed somewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eos.errors import CheckpointError, ConfigError
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.decision import ControlState
from eos.protocol.plan import digest


@dataclass
class OpenedCheckpoint:
    checkpoint: Checkpoint
    meta: CheckpointMeta | None  # None: a new checkpoint (its metadata is written at start)
    checkpoint_id: str
    pending: int | None  # the epoch logged but not committed, which Spark replays first

    @property
    def created(self) -> bool:
        return self.meta is None


@dataclass
class StartState:
    meta: CheckpointMeta
    created: bool
    pending: int | None
    changes: list[str]  # how the replay config differs from the pending epoch's (empty: it does not)


def open_checkpoint(checkpoint: Checkpoint, pipeline: str, mode: str) -> OpenedCheckpoint:
    meta = checkpoint.read_meta()
    if meta is None:
        return OpenedCheckpoint(checkpoint, None, Checkpoint.new_id(), None)
    checkpoint.check_owner(meta, pipeline)
    if meta.mode != mode:
        raise CheckpointError(
            f"the checkpoint {checkpoint.uri} was written in mode {meta.mode}; the pipeline now says "
            f"{mode}. Use a new checkpoint location to switch modes."
        )
    _check_offset_log(checkpoint)
    return OpenedCheckpoint(checkpoint, meta, meta.checkpoint_id, checkpoint.pending_replay())


def pinned_parallelism(opened: OpenedCheckpoint, slots: int | None, default: int) -> int:
    """Slots per epoch: the pipeline's `slots`, else the pending epoch's own (a replay must cut its
    records into the same slots), else Spark's default parallelism."""
    if slots is not None:
        return slots
    if opened.meta is not None and opened.pending is not None:
        return int(opened.meta.replay.get("parallelism", default))
    return default


def check_source_pin(opened: OpenedCheckpoint, source: Any) -> dict[str, Any]:
    """What the checkpoint pinned for `source` (checked against what it reads now), or a new pin."""
    if opened.meta is None:
        return source.pin()
    pinned = opened.meta.sources.get(source.name)
    if pinned is None:
        raise CheckpointError(
            f"the pipeline's sources changed: {source.name!r} is new, the checkpoint {opened.checkpoint.uri} has "
            f"{sorted(opened.meta.sources)}; Spark cannot resume a checkpoint whose sources differ",
            hint="use a new checkpoint location (or a new pipeline name) for the changed pipeline",
        )
    source.check_pin(pinned)
    return pinned


def settle(
    opened: OpenedCheckpoint, pipeline: str, mode: str, pins: dict[str, dict[str, Any]], replay: dict[str, Any]
) -> StartState:
    """The checkpoint's metadata for this start: new, or the old one with the replay config this
    start would replay under, and how it differs from the pending epoch's."""
    if opened.meta is None:
        meta = CheckpointMeta(pipeline, opened.checkpoint_id, mode, pins, replay, digest(replay))
        return StartState(meta, True, None, [])
    meta = opened.meta
    known, wanted = set(meta.sources), set(pins)
    if known != wanted:
        raise CheckpointError(
            f"the pipeline's sources changed ({sorted(known)} -> {sorted(wanted)}); Spark cannot resume a "
            "checkpoint whose sources differ. Use a new checkpoint location."
        )
    changes = []
    if opened.pending is not None and digest(replay) != meta.replay_digest:
        changes = describe_changes(meta.replay, replay) or ["(the replay config's digest differs)"]
    meta.replay, meta.replay_digest = replay, digest(replay)
    return StartState(meta, False, opened.pending, changes)


def check_name_is_ours(opened: OpenedCheckpoint, previous: Any, pipeline: str) -> None:
    """A pipeline's name belongs to one checkpoint: its transactional ids, ledger and control log
    are named after it. A new checkpoint whose name's last driver ran on another checkpoint is a
    copy of that pipeline (a copied file), and starting it would fence that pipeline's driver and
    then find its ledger foreign. Refused before anything is fenced, with the fix that is not
    destructive: the copy takes a name of its own."""
    if not opened.created or previous is None or not getattr(previous, "checkpoint_id", ""):
        return
    if previous.checkpoint_id == opened.checkpoint_id:
        return
    if previous.checkpoint and previous.checkpoint.rstrip("/") == opened.checkpoint.uri.rstrip("/"):
        # The same location, new: the checkpoint was deleted or lost its metadata. Not a copy; the
        # checkpoint's own checks and the ledger (which remembers its commits) say what happened.
        return
    where = f" at {previous.checkpoint}" if previous.checkpoint else ""
    raise CheckpointError(
        f"the pipeline name {pipeline!r} is in use by another checkpoint{where} (its last driver ran on "
        f"{previous.host}); this checkpoint ({opened.checkpoint.uri}) is new. Two checkpoints must never run one "
        "pipeline name: their transactional ids, ledger and control log would be shared.",
        hint="if this file is a copy of that pipeline, give the copy its own `name:`; if this checkpoint is meant "
        "to replace that one, stop the pipeline and `eos reset` it with its own file first",
    )


def check_changes_while_pending(prepared: StartState, state: ControlState) -> None:
    """A changed config is refused while the pending epoch may have committed anywhere: a replay
    under the new config would route or encode its records differently from what is committed
    (loss plus duplicates). Slots commit only after the epoch's decision is recorded, so without a
    decision for the pending epoch nothing of it is committed, and the new config is safe (the
    common case: an epoch that failed on a poison record, replayed with `on_error: dlq`)."""
    decided = state.decision is not None and state.decision.epoch == prepared.pending
    if prepared.changes and decided:
        raise CheckpointError(
            f"epoch {prepared.pending} is pending and was already partly committed, and must be replayed with the "
            f"config it was planned with, but the pipeline changed: {'; '.join(prepared.changes)}. Replaying it "
            "under the new config would route or encode its records differently (loss plus duplicates).",
            hint="restore the previous pipeline file, run `eos run FILE --finish-pending` (it replays the pending "
            "epoch and stops), then start with the new file",
        )


def describe_changes(before: Any, after: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            out += describe_changes(before.get(key), after.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for index, (a, b) in enumerate(zip(before, after, strict=True)):
            name = a.get("name") if isinstance(a, dict) and a.get("name") == (b or {}).get("name") else index
            out += describe_changes(a, b, f"{path}[{name}]")
        return out
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def _check_offset_log(checkpoint: Checkpoint) -> None:
    """The epoch Spark will replay must be readable: refuse to start on a damaged offset log with
    a message that says so, instead of failing inside Spark."""
    last = checkpoint.last_logged_epoch()
    if last is None:
        return
    if not checkpoint.logged_offsets(last):
        raise CheckpointError(
            f"Spark's offset log {checkpoint.uri}/offsets/{last} is corrupt: it holds no source offsets; refusing "
            "to start (eos never silently resets). Restore the checkpoint from a backup, or start on a new "
            "checkpoint location."
        )


def check_spark(spark: Any) -> None:
    """Spark settings the protocol cannot work with, refused up front with the reason."""
    # One setting, one call: sparkContext.getConf() copies every setting over Py4J (20-40 ms).
    if spark.conf.get("spark.python.worker.reuse", "true").lower() == "false":
        raise ConfigError(
            "spark.python.worker.reuse is false: eos keeps each transactional producer in the Python worker that "
            "pre-committed with it until the epoch's commit decision; without worker reuse the worker exits first "
            "and every epoch is replayed",
            hint="remove spark.python.worker.reuse=false from the Spark config",
        )

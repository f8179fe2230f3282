"""The Delta table's own log is the sink's ledger: nothing is kept beside it.

Each epoch's commit is ONE Delta version that holds the epoch's data and an application
transaction (`txn` action) `appId = eos/<pipeline>/<sink>`, `version = <epoch>`, and, in its
commitInfo, what eos's ledger entries say about every slot it commits (the key `eos`):

    "eos": {"pipeline": "clicks", "sink": "lake", "epoch": 12, "slots": {"0": {LedgerEntry...}, ...}}

The txn version answers "did epoch N commit?" for the whole table (Delta keeps every app id's
latest version in each snapshot, checkpoints included); the commitInfo tells which slots it
committed, with the offsets and config digests `committed_slots` checks. Normally one version
holds every slot of the epoch; the `sink.between_commits` failpoint commits slot by slot, each
version with the same txn version and its own slots.

`eos reset` cannot delete log entries: it commits an empty version that sets the txn version to -1
with `"eos": {"reset": true, ...}` in its commitInfo, which readers take as "nothing committed".
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from eos.api import Ledger, LedgerEntry

if TYPE_CHECKING:
    from deltalake import DeltaTable

KEY = "eos"
NOTHING = -1  # the txn version `eos reset` writes


def app_id(pipeline: str, sink: str) -> str:
    return f"eos/{pipeline}/{sink}"


def commit_info(pipeline: str, sink: str, epoch: int, entries: list[LedgerEntry], handles: list[str]) -> dict:
    slots = {}
    for entry, handle in zip(entries, handles, strict=True):
        slots[str(entry.slot)] = asdict(entry) | {"extra": {**entry.extra, "handle": handle}}
    return {KEY: {"pipeline": pipeline, "sink": sink, "epoch": epoch, "slots": slots}}


def reset_info(pipeline: str, sink: str) -> dict:
    return {KEY: {"pipeline": pipeline, "sink": sink, "reset": True}}


def committed_epoch(table: DeltaTable, pipeline: str, sink: str) -> int | None:
    """The last epoch the table says this sink committed (None: never, or reset)."""
    version = table.transaction_version(app_id(pipeline, sink))
    return None if version is None or version <= NOTHING else version


def read(table: DeltaTable, pipeline: str, sink: str, checkpoint_id: str) -> Ledger:
    """The sink's committed slots of its last epoch, from the commits that set the txn version.

    The history is read from the newest version back, until an eos commit of an older epoch (or a
    reset) of this sink: only the last epoch's slots can matter to a replay. If the log no longer
    has that epoch's commitInfo (expired after `delta.logRetentionDuration` and a checkpoint),
    the txn version alone is known: one entry for slot -1, for the current checkpoint, with no
    digests, so a replay of that same epoch is refused rather than guessed at."""
    epoch = committed_epoch(table, pipeline, sink)
    if epoch is None:
        return {}
    found: Ledger = {}
    for info in _history(table):
        eos = info.get(KEY)
        if not isinstance(eos, dict) or eos.get("pipeline") != pipeline or eos.get("sink") != sink:
            continue
        if eos.get("reset") or eos.get("epoch", epoch) < epoch:
            break
        if eos.get("epoch") == epoch:
            for slot, value in eos.get("slots", {}).items():
                found.setdefault((sink, int(slot)), _entry(value, info.get("version")))
    if not found:
        found[(sink, -1)] = LedgerEntry(
            pipeline=pipeline, sink=sink, slot=-1, epoch=epoch, checkpoint=checkpoint_id, offsets="", config="",
            extra={"note": "the log no longer holds this epoch's commitInfo"},
        )  # fmt: skip
    return found


def _entry(value: dict[str, Any], version: Any) -> LedgerEntry:
    entry = LedgerEntry(**{k: value[k] for k in LedgerEntry.__dataclass_fields__ if k in value})
    return replace(entry, extra={**entry.extra, "delta_version": version})


def _history(table: DeltaTable) -> Any:
    """The commitInfos, newest first, read in growing pages (most lookups end in the first)."""
    limit, seen = 16, 0
    while True:
        page = table.history(limit)
        yield from page[seen:]
        if len(page) < limit:
            return
        seen, limit = len(page), limit * 4

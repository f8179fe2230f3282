"""The ledger: per (sink, slot), the last epoch it committed, and what that epoch meant.

Each sink slot writes its ledger entry *inside the transaction that carries its output*, so
the entry is visible exactly when the output is (Kafka: a record in the ledger topic; a
database: a row in a ledger table). Where the entry lives is the sink's business; what it says,
and how recovery uses it, is decided here.

An entry binds its epoch to the input it covered: `offsets` is a digest of Spark's offset log
file for the epoch (the barrier: every source's planned end offsets, plus the batch's
watermark and timestamp), and `config` a digest of everything in the pipeline that decides
what a replay writes. A replay of epoch N skips a slot only if the slot committed N *for the
same offsets*: a checkpoint restored from a backup, an offset log file lost or re-planned, is
refused instead of silently skipping (or re-writing) a different range.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from eos.errors import CheckpointError

# Fields that decide whether an entry proves a slot committed a given epoch.
BINDING = ("epoch", "offsets", "config")


@dataclass(frozen=True)
class LedgerEntry:
    pipeline: str
    sink: str
    slot: int
    epoch: int
    checkpoint: str  # the checkpoint id: a ledger written from another checkpoint is refused
    offsets: str  # digest of Spark's offset log file of the epoch
    config: str  # digest of the replay-relevant config
    attempt: int = 1
    run: str = ""  # the driver run that wrote it
    records: int = 0
    written_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> LedgerEntry:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


Ledger = dict[tuple[str, int], LedgerEntry]  # (sink, slot) -> the latest committed entry


def check_against_checkpoint(ledger: Ledger, checkpoint_id: str, last_logged: int | None, where: str) -> None:
    """Refuse a ledger that cannot belong to this checkpoint's history.

    - written from another checkpoint: the checkpoint was deleted or replaced;
    - an epoch the offset log never logged: the checkpoint is older than the output (restored
      from a backup, or its newest offset log files were lost)."""
    foreign = sorted({e.checkpoint for e in ledger.values()} - {checkpoint_id})
    if foreign:
        raise CheckpointError(
            f"{where} holds commits of this pipeline from another checkpoint ({', '.join(foreign)}), not from this "
            f"one ({checkpoint_id}). Was the checkpoint deleted or replaced? Starting over would write output again "
            "(or skip it).",
            hint="if a fresh start is really intended, run `eos reset PIPELINE --yes` first",
        )
    ahead = sorted({e.epoch for e in ledger.values() if last_logged is None or e.epoch > last_logged})
    if ahead:
        logged = "no epoch" if last_logged is None else f"epochs up to {last_logged}"
        raise CheckpointError(
            f"{where} says epochs {ahead} were committed, but the checkpoint's offset log has {logged}: the checkpoint "
            "is older than the output it produced (restored from a backup? newest offset files lost?). Replaying "
            "from here would write those epochs' output a second time.",
            hint="restore the checkpoint's newest state; or, to start over deliberately, `eos reset PIPELINE --yes`",
        )


def committed_slots(ledger: Ledger, epoch: int, offsets: str, config: str) -> frozenset[tuple[str, int]]:
    """The (sink, slot) pairs that already committed `epoch`: a replay writes nothing there.

    An entry for this epoch must be bound to the same offsets and config; an entry for a later
    epoch means the offset log was rewound. Both are refused rather than guessed at."""
    skip = []
    for key, entry in ledger.items():
        if entry.epoch < epoch:
            continue
        if entry.epoch > epoch:
            raise CheckpointError(
                f"sink {entry.sink} slot {entry.slot} committed epoch {entry.epoch}, but Spark is now running epoch "
                f"{epoch}: the checkpoint's offset log was rewound (files deleted or restored from a backup). "
                "Running on would write those epochs' input a second time.",
                hint="restore the checkpoint's newest state; or, to start over deliberately, "
                "`eos reset PIPELINE --yes`",
            )
        if entry.offsets != offsets:
            raise CheckpointError(
                f"sink {entry.sink} slot {entry.slot} committed epoch {epoch} for other input than Spark now plans for "
                f"it (offset log digest {entry.offsets[:12]} then, {offsets[:12]} now): the epoch's offset log file "
                "was lost or rewritten (deleted, restored from a backup, lost in a crash before it was durable). "
                "Skipping or replaying it would lose or duplicate records.",
                hint="restore the offset log file of that epoch from the run that wrote it; or start over with "
                "`eos reset PIPELINE --yes`",
            )
        if entry.config != config:
            raise CheckpointError(
                f"sink {entry.sink} slot {entry.slot} committed epoch {epoch} under a different pipeline config than "
                "this run's; a replay under the new config would write different records.",
                hint="run the previous pipeline file until the epoch is committed (`eos run FILE --finish-pending`), "
                "then change it",
            )
        skip.append(key)
    return frozenset(skip)

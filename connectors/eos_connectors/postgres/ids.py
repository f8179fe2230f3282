"""The global transaction identifier (gid) of a slot's prepared transaction: built here, and only here.

    eos/<pipeline>/<checkpoint>/<sink>/<slot>/<epoch>/<attempt>/<task attempt>/<run>

- `/` separates the parts and appears in none of them: pipeline and sink names cannot contain it
  (eos.model.NAME, SINK_NAME), the checkpoint id and the driver run are hex, the rest are numbers.
  So a gid names exactly one (pipeline, checkpoint, sink, slot, epoch, attempt, task attempt,
  run), and `eos/<pipeline>/` is a prefix no other pipeline's gid starts with.
- PostgreSQL's gids are shorter than 200 bytes (GIDSIZE). Names may be 100 characters each, so a
  name longer than 40 characters is shortened to its first 31 characters, `~` and 8 hex digits of
  its SHA-256: `~` is in no name, so a shortened name never equals a real one.
- The checkpoint id is shortened to 16 hex digits (64 bits: enough to tell one checkpoint of a
  pipeline from another), the run is at most 16 characters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

ROOT = "eos"
SEPARATOR = "/"
MAX_BYTES = 199  # PostgreSQL: "The identifier must be ... less than 200 bytes long"
_NAME_LIMIT = 40
_PART = re.compile(r"^[^/\s]+$")


def _short(name: str) -> str:
    if len(name) <= _NAME_LIMIT:
        return name
    return f"{name[:31]}~{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _check(part: str, what: str) -> str:
    if not _PART.match(part) or "'" in part:
        raise ValueError(f"{what} {part!r} cannot be part of a prepared transaction's gid (no '/', quotes or spaces)")
    return part


def pipeline_prefix(pipeline: str) -> str:
    """What every gid of `pipeline` starts with, and no other pipeline's does."""
    return f"{ROOT}{SEPARATOR}{_check(_short(pipeline), 'pipeline name')}{SEPARATOR}"


@dataclass(frozen=True)
class Gid:
    pipeline: str
    checkpoint: str
    sink: str
    slot: int
    epoch: int
    attempt: int
    task_attempt: int
    run: str

    def __str__(self) -> str:
        parts = [
            _check(self.checkpoint[:16], "checkpoint id"),
            _check(_short(self.sink), "sink name"),
            *(str(int(n)) for n in (self.slot, self.epoch, self.attempt, self.task_attempt)),
            _check(self.run[:16], "driver run"),
        ]
        gid = pipeline_prefix(self.pipeline) + SEPARATOR.join(parts)
        if len(gid.encode()) > MAX_BYTES:  # cannot happen with the limits above; kept as a guard
            raise ValueError(f"gid {gid!r} is longer than {MAX_BYTES} bytes")
        return gid


def parse(gid: str) -> Gid | None:
    """The parts of an eos gid, as they appear in it (names possibly shortened: shortening is
    idempotent, so str() of the result is `gid` again); None for any other gid."""
    parts = gid.split(SEPARATOR)
    if len(parts) != 9 or parts[0] != ROOT:
        return None
    try:
        numbers = [int(p) for p in parts[4:8]]
    except ValueError:
        return None
    return Gid(parts[1], parts[2], parts[3], *numbers, parts[8])

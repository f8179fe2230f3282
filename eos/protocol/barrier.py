"""One barrier per source and epoch: every scan of a source ends the epoch at the same offsets.

A query scans a source more than once: its main scan, the scan its poison rows come from
(eos.protocol.source), and one more for every other place the SQL reads the source's view. Spark
plans each scan on its own, in a Python process of its own, one after the other, and logs one end
per scan. Planned independently from a log that grows between those calls, the scans of one
epoch would end at different offsets. Each scan would still be exactly-once on its own, but the
pipeline would lose records when `on_error` changes between runs: switched from `fail` to `dlq`,
a poison record that the poison scan had already passed (reading nothing, under `fail`) and the
main scan had not yet reached is dropped by the main scan and never reaches the dead-letter
queue; switched from `dlq` to `fail`, the same happens the other way round.

So the scans agree. Spark asks every scan for its ends once per planning round, in the same
order, and in a round either asks them all or none (a round that finds nothing new plans no
epoch, and the next round asks again). The first scan asked in a round publishes its ends in a
folder on the driver's machine (every scan is planned there); every other scan of the source
asked in that round, from the same start, takes them instead of planning. Scans that start
together then end together, epoch after epoch. An entry is keyed by the run (a new run plans
afresh, under its own settings), the round (each scan counts the rounds it was asked in) and
the start offsets (should the counts ever disagree, a scan plans on its own rather than take
ends planned from another start); only the newest entries are kept.

Ends read back are not trusted for being there. The folder is private (mode 0700, this user's:
eos.private): for a remote checkpoint it is under the machine's temp folder, where any local
user could have made it first and planted ends below the start (a re-read: duplicates) or beyond
the log's end. And a scan that takes ends checks them before it uses them (`check`: the source
knows its start and its log's latest offsets).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eos.private import private_folder

KEEP = 16  # entries kept per source: a batch's scans need only its own, taken milliseconds later


@dataclass(frozen=True)
class SharedEnds:
    """Where the scans of one source agree on each epoch's end offsets (picklable: it travels to
    the process Spark plans each scan in)."""

    folder: str
    run: str

    def agree(
        self, round_: int, start: Any, plan: Callable[[], Any], check: Callable[[Any], None] | None = None
    ) -> Any:
        """The ends of the epoch starting at `start` in planning round `round_`: another scan's,
        if one was asked first (passed to `check` first, which raises if they cannot be right),
        else `plan()`'s, published for the others. Ends and start are JSON values."""
        folder = private_folder(Path(self.folder))
        key = json.dumps([self.run, round_, start], sort_keys=True)
        entry = folder / hashlib.sha256(key.encode()).hexdigest()[:32]
        with contextlib.suppress(FileNotFoundError):
            return _taken(entry, check)
        ends = plan()
        descriptor, written = tempfile.mkstemp(dir=folder, prefix=".")
        try:
            with os.fdopen(descriptor, "w") as out:
                json.dump(ends, out)
            try:
                # A link never replaces an entry: were two scans ever planned at once, the first
                # to publish would win and the other would take its ends.
                os.link(written, entry)
            except FileExistsError:
                return _taken(entry, check)
            except OSError:
                # A filesystem without hard links: Spark asks the scans one after the other, so
                # a plain atomic rename publishes just as well there.
                os.replace(written, entry)
        finally:
            with contextlib.suppress(FileNotFoundError):  # renamed into place
                os.unlink(written)
        _prune(folder, entry)
        return ends


def _taken(entry: Path, check: Callable[[Any], None] | None) -> Any:
    ends = json.loads(entry.read_text())
    if check is not None:
        check(ends)
    return ends


def _prune(folder: Path, newest: Path) -> None:
    """Keep the KEEP newest entries, and always `newest` (whatever the clock did meanwhile)."""
    entries: list[tuple[int, Path]] = []
    for path in folder.iterdir():
        if not path.name.startswith(".") and path != newest:
            with contextlib.suppress(FileNotFoundError):  # pruned by another run meanwhile
                entries.append((path.stat().st_mtime_ns, path))
    for _, path in sorted(entries)[: max(0, len(entries) - (KEEP - 1))]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

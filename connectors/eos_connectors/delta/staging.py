"""A slot's pre-commit in a Delta table: its data files, written where they will live but named in no
version of the log, and a manifest that lists them.

    <table>/day=2024-05-01/eos-e12-a1-s0-3f9c2a1b7d4e-0.parquet     append: the data files
    <table>/_eos_staged/<pipeline>/<sink>/e12-a1-s0-t0-3f9c2a1b7d4e.file-0   a note: "day=2024-05-01/eos-..."
    <table>/_eos_staged/<pipeline>/<sink>/e12-a1-s0-t0-3f9c2a1b7d4e.rows-0.parquet
                                                                    upsert: the rows the MERGE reads
    <table>/_eos_staged/<pipeline>/<sink>/e12-a1-s0-t0-3f9c2a1b7d4e.json   the manifest (the handle)

A file's name carries its epoch, attempt and slot and a random id: no two attempts' files collide,
and an operator can tell eos's files apart. Before an append data file is written, a note in the
staging folder names it, so an attempt killed mid-write leaves nothing that cannot be found
without listing the whole table. The manifest is written last, in one put (atomic on
object stores, a rename on a local disk), so a manifest names only complete files; its path
relative to the table is the slot's handle in the recorded decision. Delta readers read only the
log, so nothing staged is visible; `_`-prefixed folders are skipped by VACUUM (Spark's and
delta-rs's), so manifests and upsert rows are safe from it, while append data files sit in the
table's folders like any writer's files in flight (docs/DELTA.md: VACUUM's retention).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from eos.api import LedgerEntry
from eos_connectors.delta.table import Store

ROOT = "_eos_staged"
FORMAT = 1


def folder(pipeline: str, sink: str) -> str:
    """Where one sink's manifests live (names hold no `/`: eos.model.NAME, SINK_NAME)."""
    return f"{ROOT}/{pipeline}/{sink}"


def stem(epoch: int, attempt: int, slot: int, task_attempt: int, random_id: str) -> str:
    return f"e{epoch}-a{attempt}-s{slot}-t{task_attempt}-{random_id}"


@dataclass(frozen=True)
class StagedFile:
    """One data file: the fields of its add action (append) or just its path (upsert rows)."""

    path: str  # relative to the table, as on the filesystem (not percent-encoded)
    size: int
    partition_values: dict[str, str | None] = field(default_factory=dict)
    modification_time: int = 0
    stats: str = ""


@dataclass(frozen=True)
class Manifest:
    handle: str  # its own path, relative to the table
    pipeline: str
    sink: str
    slot: int
    epoch: int
    attempt: int
    task_attempt: int
    mode: str
    entry: dict[str, Any]  # the slot's LedgerEntry: what the commit records for it
    files: tuple[StagedFile, ...]
    written_at: float = field(default_factory=time.time)
    format: int = FORMAT

    def ledger_entry(self) -> LedgerEntry:
        return LedgerEntry(**self.entry)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        value = json.loads(data)
        value["files"] = tuple(StagedFile(**f) for f in value["files"])
        return cls(**value)


def handle(pipeline: str, sink: str, stem_: str) -> str:
    return f"{folder(pipeline, sink)}/{stem_}.json"


def stem_of(path: str) -> str:
    """The attempt a file of the staging folder belongs to (`<folder>/<stem>.<what>`)."""
    return path.rsplit("/", 1)[-1].split(".", 1)[0]


def write(store: Store, manifest: Manifest) -> None:
    store.put(manifest.handle, manifest.to_json())


def note(store: Store, pipeline: str, sink: str, stem_: str, number: int, path: str) -> None:
    """Before a data file is written outside the staging folder: say where, so an attempt that
    dies before its manifest leaves nothing that cannot be found and removed."""
    store.put(f"{folder(pipeline, sink)}/{stem_}.file-{number}", path.encode())


def read(store: Store, handle_: str) -> Manifest | None:
    """The manifest at `handle_`; None if it is gone."""
    try:
        return Manifest.from_json(store.get(handle_))
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Attempt:
    """What one slot attempt left in the staging folder."""

    stem: str
    paths: tuple[str, ...]  # its files in the staging folder

    @property
    def manifest(self) -> str | None:
        return next((p for p in self.paths if p.endswith(".json")), None)

    @property
    def epoch(self) -> int:
        return int(self.stem.split("-", 1)[0].removeprefix("e"))


def attempts(store: Store, pipeline: str, sink: str) -> list[Attempt]:
    """Every slot attempt with files in the sink's staging folder, by epoch."""
    by_stem: dict[str, list[str]] = {}
    for path in store.listing(folder(pipeline, sink)):
        by_stem.setdefault(stem_of(path), []).append(path)
    found = [Attempt(s, tuple(sorted(paths))) for s, paths in by_stem.items()]
    return sorted(found, key=lambda a: (a.epoch, a.stem))


def data_files(store: Store, attempt: Attempt) -> list[str]:
    """The data files an attempt wrote outside the staging folder: its manifest's, and those its
    notes name (an attempt that died mid-write has notes and no manifest)."""
    found: list[str] = []
    manifest = read(store, attempt.manifest) if attempt.manifest else None
    if manifest is not None:
        found += [f.path for f in manifest.files if not f.path.startswith(ROOT + "/")]
    for path in attempt.paths:
        if ".file-" in path.rsplit("/", 1)[-1]:
            with contextlib.suppress(FileNotFoundError):
                found.append(store.get(path).decode())
    return sorted(set(found))

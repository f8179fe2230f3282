"""eos's own part of a checkpoint: `<checkpoint>/_eos/pipeline.json`, beside Spark's logs.

It pins what must not change for the life of a checkpoint: which pipeline owns it, its id
(written into every ledger record), the number of sink slots, and each source's resolved
starting offsets (so `initialOffset` is stable across restarts). A checkpoint that belongs to
another pipeline, lacks this file while holding Spark state, or cannot be parsed, is refused:
eos never silently starts over.

Spark's offset log (`offsets/N`) and commit log (`commits/N`) are read here too, for recovery
reports and `eos status`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eos.errors import CheckpointError, ConfigError

FORMAT_VERSION = 1


@dataclass
class CheckpointMeta:
    pipeline: str
    checkpoint_id: str
    slots: int
    mode: str
    sources: dict[str, dict[str, Any]]  # name -> {"topics": [...], "starting": encoded offsets}
    sinks: list[str]
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT_VERSION


def local_path(location: str) -> Path:
    if location.startswith("file:"):
        location = location.removeprefix("file://").removeprefix("file:")
    if "://" in location:
        raise ConfigError(
            f"checkpoint {location!r}: eos keeps its checkpoint metadata with local file IO; use a local path "
            "or a shared mount (NFS, a Kubernetes volume) that the driver and executors all see"
        )
    return Path(location).expanduser().resolve()


class Checkpoint:
    def __init__(self, location: str):
        self.root = local_path(location)
        self.meta_dir = self.root / "_eos"
        self.meta_file = self.meta_dir / "pipeline.json"
        self._lock_fd: int | None = None

    # -- Spark's logs --------------------------------------------------------------------------
    def _batch_ids(self, folder: str) -> list[int]:
        path = self.root / folder
        if not path.is_dir():
            return []
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())

    def last_logged_epoch(self) -> int | None:
        ids = self._batch_ids("offsets")
        return ids[-1] if ids else None

    def last_committed_epoch(self) -> int | None:
        ids = self._batch_ids("commits")
        return ids[-1] if ids else None

    def pending_replay(self) -> int | None:
        """The epoch logged but not marked committed, which Spark replays first (with its logged
        offsets) on the next start; None if there is none."""
        logged, committed = self.last_logged_epoch(), self.last_committed_epoch()
        if logged is not None and (committed is None or committed < logged):
            return logged
        return None

    def logged_offsets(self, epoch: int) -> list[dict[str, Any]]:
        """The end offsets Spark logged for an epoch, one dict per source (in plan order)."""
        path = self.root / "offsets" / str(epoch)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise CheckpointError(f"cannot read Spark's offset log {path}: {exc}") from exc
        if not lines or not lines[0].startswith("v"):
            raise CheckpointError(f"Spark's offset log {path} is corrupt (no version line)")
        try:
            return [json.loads(line) if line != "-" else {} for line in lines[2:]]
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"Spark's offset log {path} is corrupt: {exc}") from exc

    def has_spark_state(self) -> bool:
        return (self.root / "offsets").is_dir() or (self.root / "metadata").exists()

    # -- eos metadata --------------------------------------------------------------------------
    def read_meta(self) -> CheckpointMeta | None:
        if not self.meta_file.exists():
            if self.has_spark_state():
                raise CheckpointError(
                    f"{self.root} holds a Spark checkpoint but no eos metadata ({self.meta_file}); it was not "
                    "written by eos, or its _eos folder was lost. Refusing to start: eos never silently resets."
                )
            return None
        try:
            data = json.loads(self.meta_file.read_text())
            if data.get("format") != FORMAT_VERSION:
                raise CheckpointError(f"{self.meta_file}: unknown format {data.get('format')!r}")
            return CheckpointMeta(**data)
        except (json.JSONDecodeError, TypeError) as exc:
            raise CheckpointError(
                f"{self.meta_file} is corrupt ({exc}); refusing to start. Restore it from a backup, or start the "
                "pipeline on a new checkpoint location (after `eos reset` if it must re-read its input)."
            ) from exc

    def write_meta(self, meta: CheckpointMeta) -> None:
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        staging = self.meta_file.with_suffix(".tmp")
        staging.write_text(json.dumps(asdict(meta), indent=2, sort_keys=True))
        os.replace(staging, self.meta_file)

    def check_owner(self, meta: CheckpointMeta, pipeline: str) -> None:
        if meta.pipeline != pipeline:
            raise CheckpointError(
                f"checkpoint {self.root} belongs to pipeline {meta.pipeline!r}, not {pipeline!r}; "
                "refusing to start (two pipelines must never share a checkpoint)"
            )

    @staticmethod
    def new_meta(pipeline: str, slots: int, mode: str, sources: dict[str, dict[str, Any]], sinks: list[str]):
        return CheckpointMeta(pipeline, uuid.uuid4().hex, slots, mode, sources, sinks)

    # -- one runner at a time ------------------------------------------------------------------
    def lock(self) -> None:
        """Hold an exclusive lock while running; released by the OS if the process dies."""
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.meta_dir / "lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 100).decode(errors="replace").strip()
            os.close(fd)
            raise CheckpointError(
                f"another eos process is running this checkpoint ({self.root}; holder: {holder or 'unknown'})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

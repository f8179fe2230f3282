"""The checkpoint: Spark's logs, and eos's own metadata beside them (`<checkpoint>/_eos/pipeline.json`).

The checkpoint may live wherever Spark keeps checkpoints: a local path, `file://`, `hdfs://`,
`s3a://` (eos adds the connector: eos.s3a; docs/S3.md), or any Hadoop FileSystem (`abfss://`,
`gs://` with their connectors on the classpath).
Local paths are read with plain file IO; everything else through Spark's own
`CheckpointFileManager` (py4j), the component Spark writes its offset and commit logs with: a
write is a new file renamed into place, so a reader sees the old file or the new one, never a
torn one. There are no locks here: single-writer is enforced through the control log
(eos.protocol.decision), which works wherever the checkpoint is.

eos's metadata pins, for the checkpoint's life, which pipeline owns it, its id (written into
every ledger entry), the mode, and each source's pin (resolved starting positions, topic
identity); and, for as long as an epoch is pending, the *replay config*: everything that decides
what a replay writes (sources, transforms, sinks, formats, slots). A start with a different
replay config while an epoch is pending is refused (a replay must repeat what was planned);
with nothing pending it is recorded as the new replay config. It also keeps the poison decisions
recorded for the sources (eos.protocol.poison), which every later attempt routes by.

The metadata is private: `_eos` is a 0700 folder and `pipeline.json` a 0600 file (through Hadoop,
the same permissions where the filesystem has them; an object store has none). Spark's own files
keep Spark's permissions.

`eos reset` deletes a checkpoint: only what Spark and eos write there (foreign_entries), then
the folder if that emptied it. It refuses a folder that holds anything else, and a location whose
deletion could take what is not the checkpoint's (unsafe_location).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from eos.errors import CheckpointError, ConfigError
from eos.private import private_dir, private_folder

FORMAT_VERSION = 2
META = "_eos/pipeline.json"


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def local_path(location: str) -> Path:
    if location.startswith("file:"):
        location = location.removeprefix("file://").removeprefix("file:")
    return Path(location).expanduser().resolve()


class _LocalFiles:
    def __init__(self, root: str):
        self.root = local_path(root)

    def uri(self) -> str:
        return self.root.as_posix()

    def read(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except FileNotFoundError:
            return None

    def write_atomic(self, rel: str, text: str) -> None:
        """A private file (0600) in private folders (0700) below the checkpoint's own folder."""
        target = self.root / rel
        self.root.mkdir(parents=True, exist_ok=True)  # the checkpoint's folder: Spark's permissions
        folder = self.root
        for part in Path(rel).parent.parts:
            folder = folder / part
            private_dir(folder)
        # Named like a temporary file of Spark's: foreign_entries knows both.
        staging = target.with_name(f".{target.name}.{uuid.uuid4()}.tmp")
        with os.fdopen(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, target)

    def list(self, rel: str) -> list[str]:
        folder = self.root / rel
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def delete(self, rel: str) -> None:
        path = self.root / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)  # a link goes, never what it points to

    def remove_if_empty(self) -> bool:
        """Remove the checkpoint's folder if it is empty; whether it is gone."""
        try:
            self.root.rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # not empty
            return False
        return True


class _HadoopFiles:
    """Through the JVM's Hadoop FileSystem and Spark's CheckpointFileManager (py4j)."""

    def __init__(self, root: str, jvm: Any, hadoop_conf: Any):
        self.jvm = jvm
        self.conf = hadoop_conf
        self._root = root.rstrip("/")
        # Resolved once: py4j resolves `jvm.org.apache...` a package segment at a time, each a
        # failed class search through every jar (2.6 ms per Path built that way, 0.16 ms through
        # the resolved class; several per epoch).
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._IOUtils = jvm.org.apache.commons.io.IOUtils
        path = self._Path(self._root)
        try:
            self.fs = path.getFileSystem(hadoop_conf)
        except Exception as exc:  # py4j's error, holding Hadoop's
            missing = re.search(r"Class (\S+) not found|No FileSystem for scheme \S+", str(exc))
            if missing is None:
                raise
            raise CheckpointError(
                f"checkpoint {root}: this Spark has no Hadoop connector for {urlsplit(root).scheme}:// "
                f"({missing.group(0)})",
                hint="eos adds the S3A connector (hadoop-aws) for s3a:// to the Spark it starts itself; a session "
                "started elsewhere (spark-submit, your own SparkSession) needs the connector on its classpath, "
                "e.g. --packages org.apache.hadoop:hadoop-aws:<the Hadoop version PySpark bundles> (docs/S3.md)",
            ) from None
        managers = getattr(jvm.org.apache.spark.sql.execution.streaming.checkpointing, "CheckpointFileManager$")
        self.manager = getattr(managers, "MODULE$").create(path, hadoop_conf)

    def _path(self, rel: str) -> Any:
        return self._Path(f"{self._root}/{rel}" if rel else self._root)

    def uri(self) -> str:
        return self._root

    def read(self, rel: str) -> str | None:
        path = self._path(rel)
        if not self.fs.exists(path):
            return None
        stream = self.fs.open(path)
        try:
            data = self._IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode()

    def write_atomic(self, rel: str, text: str) -> None:
        """A 0600 file in a 0700 folder where the filesystem has permissions (HDFS does, an object
        store does not): the folder is made private before the file is written into it."""
        path = self._path(rel)
        self.manager.mkdirs(path.getParent())
        self._set_permission(path.getParent(), "700")
        stream = self.manager.createAtomic(path, True)
        try:
            stream.write(bytearray(text.encode()))
            stream.close()
        except Exception:
            stream.cancel()
            raise
        self._set_permission(path, "600")

    def _set_permission(self, path: Any, octal: str) -> None:
        from py4j.protocol import Py4JJavaError

        permission = self.jvm.org.apache.hadoop.fs.permission.FsPermission(octal)
        try:
            self.fs.setPermission(path, permission)
        except Py4JJavaError as exc:  # a filesystem without permissions may say so
            if "UnsupportedOperationException" not in str(exc.java_exception.getClass().getName()):
                raise

    def list(self, rel: str) -> list[str]:
        path = self._path(rel)
        if not self.fs.exists(path):
            return []
        return sorted(status.getPath().getName() for status in self.fs.listStatus(path))

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._path(rel)))

    def is_file(self, rel: str) -> bool:
        return bool(self.fs.isFile(self._path(rel)))

    def delete(self, rel: str) -> None:
        self.fs.delete(self._path(rel), True)

    def remove_if_empty(self) -> bool:
        root = self._path("")
        if not self.fs.exists(root):
            return True
        if len(self.fs.listStatus(root)) > 0:
            return False
        return bool(self.fs.delete(root, False))


def scratch_dir(location: str) -> Path:
    """A folder on the driver's machine for a checkpoint's local state (failpoint firings, the
    ends its scans agree on): beside Spark's logs for a local checkpoint, else in the machine's
    temp folder (where every local user may create files: Checkpoint.scratch_dir makes it private
    before it is used)."""
    if is_local(location):
        return local_path(location) / "_eos" / "scratch"
    name = hashlib.sha256(location.rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"eos-scratch-{name}"


# What a checkpoint holds, and nothing else: Spark's streaming checkpoint (Spark 4's
# StreamingCheckpointConstants: `metadata`, `offsets`, `commits`, `state`; MicroBatchExecution:
# `sources`) and eos's `_eos`. Beside a file, a write may leave its temporary file (Spark's
# CheckpointFileManager writes `.NAME.<uuid>[.TID<n>].tmp` and renames it into place; eos's local
# writes are named the same) and Hadoop's local filesystem a checksum (`.NAME.crc`, of either).
SPARK_FOLDERS = ("offsets", "commits", "sources", "state")
EOS_FOLDER = "_eos"
BATCH = r"\d+"  # a log's files (offsets/N, commits/N, sources/<source>/N) and numbered folders


def _written(name: str, base: str) -> bool:
    """Whether `name` is the file `base` (a regex) or what a write of it leaves beside it."""
    temporary = rf"\.{base}\.[0-9a-f-]{{36}}(?:\.TID\d+)?\.tmp"
    return re.fullmatch(rf"{base}|\.{base}\.crc|{temporary}|\.{temporary}\.crc", name) is not None


def foreign_entries(files: _LocalFiles | _HadoopFiles) -> list[str]:
    """What in the checkpoint's folder neither Spark nor eos wrote (paths relative to it). Spark's
    folders are looked into one level (two for `sources`): a log holds numbered files, `sources`
    and `state` numbered folders. What is below is the state store's own (RocksDB, deltas, schemas)."""
    foreign: list[str] = []

    def expect(folder: str, names: list[str], ok: Any) -> list[str]:
        foreign.extend(f"{folder}/{name}" for name in names if not ok(name))
        return [name for name in names if ok(name)]

    for name in files.list(""):
        if name in ("offsets", "commits"):
            expect(name, files.list(name), lambda n: _written(n, BATCH))
        elif name == "sources":
            for source in expect(name, files.list(name), str.isdigit):
                expect(f"{name}/{source}", files.list(f"{name}/{source}"), lambda n: _written(n, BATCH))
        elif name == "state":
            expect(name, files.list(name), str.isdigit)
        elif name == EOS_FOLDER:
            expect(name, files.list(name), lambda n: n == "scratch" or _written(n, r"pipeline\.json"))
        elif not _written(name, "metadata"):
            foreign.append(name)
    return foreign


DELETABLE = (
    "give the pipeline a checkpoint folder of its own (`checkpoint: checkpoints/NAME`): stop the pipeline, move "
    "Spark's and eos's entries (offsets, commits, metadata, sources, state, _eos) into that folder, point "
    "`checkpoint:` at it, and run eos reset again"
)


def unsafe_location(location: str, pipeline_file: Path | None = None) -> str | None:
    """Why eos must never delete the folder at `location`, or None: the filesystem's root (a
    remote filesystem's too), or the home folder, the current folder or the pipeline file's
    folder, or a folder that holds one of them."""
    if not is_local(location):
        parts = urlsplit(location)
        if not parts.path.strip("/"):
            return f"{location} is the root of the filesystem {parts.scheme}://{parts.netloc}"
        return None
    path = local_path(location)
    if path == Path(path.anchor):
        return f"{location} is the filesystem's root"
    named = [(Path.home().resolve(), "your home folder"), (Path.cwd().resolve(), "the current folder")]
    if pipeline_file is not None:
        named.append((pipeline_file.resolve().parent, f"the folder of the pipeline file {pipeline_file}"))
    for inside, what in named:
        if inside == path:
            return f"{location} is {what}"
    for inside, what in named:
        if inside.is_relative_to(path):
            return f"{location} holds {what} ({inside})"
    return None


@dataclass
class CheckpointMeta:
    pipeline: str
    checkpoint_id: str
    mode: str
    sources: dict[str, dict[str, Any]]  # source name -> its pin
    replay: dict[str, Any]  # the replay config the pending (or next) epoch was planned with
    replay_digest: str
    # source name -> the poison decisions recorded for it (eos.protocol.poison): the source's own
    # strings, kept for the checkpoint's life, never part of the replay digest (they only grow)
    poison: dict[str, list[str]] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT_VERSION


class Checkpoint:
    def __init__(self, location: str, spark: Any = None):
        """`spark`: a SparkSession, needed for a location that is not a local path."""
        self.location = location
        if is_local(location):
            self.files: _LocalFiles | _HadoopFiles = _LocalFiles(location)
        else:
            if spark is None:
                raise CheckpointError(f"checkpoint {location}: reading a non-local checkpoint needs a Spark JVM")
            self.files = _HadoopFiles(location, spark._jvm, spark._jsc.hadoopConfiguration())

    @property
    def uri(self) -> str:
        return self.files.uri()

    @property
    def local(self) -> Path | None:
        return self.files.root if isinstance(self.files, _LocalFiles) else None

    def scratch_dir(self) -> Path:
        """The checkpoint's scratch folder, private (private_folder); the checkpoint's own folder
        is created if need be (with Spark's permissions: Spark would create it)."""
        folder = scratch_dir(self.uri)
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)
            private_dir(folder.parent)
        return private_folder(folder)

    # -- Spark's logs --------------------------------------------------------------------------
    def _batch_ids(self, folder: str) -> list[int]:
        return sorted(int(name) for name in self.files.list(folder) if name.isdigit())

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

    def offset_log(self, epoch: int) -> str:
        text = self.files.read(f"offsets/{epoch}")
        if text is None:
            raise CheckpointError(f"Spark's offset log {self.uri}/offsets/{epoch} does not exist")
        return text

    def offsets_digest(self, epoch: int) -> str:
        """The digest a ledger entry of `epoch` carries: the whole offset log file (every source's
        planned end offsets, the batch's watermark and timestamp)."""
        return hashlib.sha256(self.offset_log(epoch).encode()).hexdigest()

    def logged_offsets(self, epoch: int) -> list[dict[str, Any]]:
        """The end offsets Spark logged for an epoch, one dict per source (in plan order)."""
        path = f"{self.uri}/offsets/{epoch}"
        lines = self.offset_log(epoch).splitlines()
        if not lines or not lines[0].startswith("v"):
            raise CheckpointError(f"Spark's offset log {path} is corrupt (no version line)")
        try:
            return [json.loads(line) if line != "-" else {} for line in lines[2:]]
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"Spark's offset log {path} is corrupt: {exc}") from exc

    def has_spark_state(self) -> bool:
        return self.files.exists("offsets") or self.files.exists("metadata")

    # -- eos metadata --------------------------------------------------------------------------
    def read_meta(self) -> CheckpointMeta | None:
        where = f"{self.uri}/{META}"
        text = self.files.read(META)
        if text is None:
            if self.has_spark_state():
                raise CheckpointError(
                    f"{self.uri} holds a Spark checkpoint but no eos metadata ({where}); it was not written by eos, "
                    "or its _eos folder was lost. Refusing to start: eos never silently resets."
                )
            return None
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT_VERSION:
                raise CheckpointError(
                    f"{where}: format {data.get('format')!r}, this eos reads format {FORMAT_VERSION}",
                    hint="run the eos version that wrote this checkpoint, or start on a new checkpoint location",
                )
            return CheckpointMeta(**data)
        except (json.JSONDecodeError, TypeError) as exc:
            raise CheckpointError(
                f"{where} is corrupt ({exc}); refusing to start. Restore it from a backup, or start the pipeline on "
                "a new checkpoint location (after `eos reset` if it must re-read its input)."
            ) from exc

    def write_meta(self, meta: CheckpointMeta) -> None:
        self.files.write_atomic(META, json.dumps(asdict(meta), indent=2, sort_keys=True))

    def check_owner(self, meta: CheckpointMeta, pipeline: str) -> None:
        if meta.pipeline != pipeline:
            raise CheckpointError(
                f"checkpoint {self.uri} belongs to pipeline {meta.pipeline!r}, not {pipeline!r}; refusing to start "
                "(two pipelines must never share a checkpoint)"
            )

    # -- reset ---------------------------------------------------------------------------------
    def check_deletable(self, pipeline_file: Path | None = None) -> None:
        """Refuse a checkpoint eos must not delete: a location that holds what is not the
        checkpoint's (unsafe_location), or a folder that holds anything Spark and eos did not
        write there (foreign_entries). A location with nothing there is fine."""
        if problem := unsafe_location(self.location, pipeline_file):
            raise ConfigError(f"refusing to delete the checkpoint: {problem}", hint=DELETABLE)
        if self.files.is_file(""):
            raise CheckpointError(f"refusing to delete the checkpoint: {self.uri} is a file, not a checkpoint folder")
        foreign = foreign_entries(self.files)
        if foreign:
            shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
            raise CheckpointError(
                f"refusing to delete the checkpoint {self.uri}: it holds what neither Spark nor eos wrote: {shown}",
                hint="eos reset deletes only a checkpoint's own files; move the others out of the checkpoint's "
                "folder and run eos reset again",
            )

    def delete(self) -> bool:
        """Delete what Spark and eos wrote in the checkpoint (call check_deletable first), then its
        folder if that left it empty. Whether the folder is gone (what appeared there meanwhile,
        neither Spark's nor eos's, is left, and so is the folder). A remote checkpoint's scratch
        folder on this machine goes too."""
        for name in self.files.list(""):
            if name in SPARK_FOLDERS or name == EOS_FOLDER or _written(name, "metadata"):
                self.files.delete(name)
        if self.local is None:  # a remote checkpoint's scratch folder is on this machine
            scratch = scratch_dir(self.uri)
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(scratch)
                if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():  # eos's, not a planted one
                    shutil.rmtree(scratch)
        return self.files.remove_if_empty()

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

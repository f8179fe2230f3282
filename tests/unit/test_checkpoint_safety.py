"""What `eos reset` may delete (eos.protocol.checkpoint), and eos's private folders (eos.private):
pure file logic on real folders. The Kafka side of a reset, and a reset on a checkpoint Spark
wrote, are in tests/integration/test_reset.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eos.errors import CheckpointError, ConfigError
from eos.private import private_folder
from eos.protocol.checkpoint import (
    Checkpoint,
    CheckpointMeta,
    foreign_entries,
    scratch_dir,
    unsafe_location,
)

# A stateful query's checkpoint as Spark 4.3 wrote it (a dropDuplicates and a count, two batches,
# on the local filesystem), with a crash's leftover temporary files, and eos's own folder.
SPARK_AND_EOS = [
    "metadata", ".metadata.crc",
    ".metadata.0b6f3a52-8d3e-4c55-9a47-1d5e0f2b7c11.tmp", "..metadata.0b6f3a52-8d3e-4c55-9a47-1d5e0f2b7c11.tmp.crc",
    "offsets/0", "offsets/.0.crc", "offsets/1", "offsets/.1.crc",
    "offsets/.2.6c1d2e3f-0a1b-4c5d-8e9f-a0b1c2d3e4f5.TID7.tmp",
    "commits/0", "commits/.0.crc", "commits/1", "commits/.1.crc",
    "sources/0/0", "sources/0/.0.crc",
    "state/0/_metadata/metadata", "state/0/_metadata/.metadata.crc", "state/0/0/1.delta", "state/0/0/.1.delta.crc",
    "state/0/0/_metadata/schema", "state/1/1/2.delta",
    "_eos/pipeline.json", "_eos/.pipeline.json.0b6f3a52-8d3e-4c55-9a47-1d5e0f2b7c11.tmp",
    "_eos/scratch/barriers/events/0123abcd", "_eos/scratch/failpoints/sink_after_precommit_kill_times_1.0",
]  # fmt: skip


def lay_out(root: Path, files: list[str]) -> Path:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    return root


# -- where a checkpoint may never be ---------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home" / "alice"
    folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(folder))
    return folder


def test_the_root_the_home_folder_and_the_current_folder_are_refused(home: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path / "home")
    assert unsafe_location("/") == "/ is the filesystem's root"
    assert unsafe_location("file:///") == "file:/// is the filesystem's root"
    assert unsafe_location("~") == "~ is your home folder"
    assert unsafe_location(str(home)) == f"{home} is your home folder"
    assert unsafe_location(str(home.parent)) == f"{home.parent} is the current folder"
    assert unsafe_location(str(tmp_path)) == f"{tmp_path} holds your home folder ({home})"
    assert unsafe_location("~/checkpoints/orders") is None
    assert unsafe_location(str(home / "ck")) is None


def test_the_pipeline_files_folder_and_every_folder_above_it_are_refused(home: Path, tmp_path):
    pipeline = tmp_path / "project" / "pipelines" / "orders.yaml"
    pipeline.parent.mkdir(parents=True)
    pipeline.write_text("name: orders\n")
    folder = pipeline.parent
    assert unsafe_location(str(folder), pipeline) == f"{folder} is the folder of the pipeline file {pipeline}"
    assert unsafe_location(str(folder.parent), pipeline) == (
        f"{folder.parent} holds the folder of the pipeline file {pipeline} ({folder})"
    )
    assert unsafe_location(str(folder / "ck"), pipeline) is None
    assert unsafe_location(str(tmp_path / "elsewhere"), pipeline) is None


@pytest.mark.parametrize("root", ["hdfs://nn:8020", "hdfs://nn:8020/", "hdfs:///", "s3a://bucket", "s3a://bucket//"])
def test_a_remote_filesystems_root_is_refused(root: str):
    assert unsafe_location(root) is not None and "is the root of the filesystem" in unsafe_location(root)


def test_a_remote_folder_is_not_refused_for_its_name():
    assert unsafe_location("hdfs://nn:8020/eos/orders") is None
    assert unsafe_location("s3a://bucket/ck") is None


# -- what a checkpoint may hold ---------------------------------------------------------------------


def test_what_spark_and_eos_write_is_all_a_checkpoint_may_hold(tmp_path: Path):
    root = lay_out(tmp_path / "ck", SPARK_AND_EOS)
    checkpoint = Checkpoint(str(root))
    assert foreign_entries(checkpoint.files) == []
    checkpoint.check_deletable()  # no error


@pytest.mark.parametrize(
    "foreign",
    ["notes.txt", "offsets/README", "sources/main.py", "sources/0/lib.py", "state/cache/x", "_eos/keys.pem", ".env"],
)
def test_anything_else_is_named_and_refused_and_nothing_is_deleted(tmp_path: Path, foreign: str):
    root = lay_out(tmp_path / "ck", [*SPARK_AND_EOS, foreign])
    checkpoint = Checkpoint(str(root))
    # `state/cache/x` is named by its folder: below state/<number>/ everything is the state store's
    named = foreign if not foreign.startswith("state/") else "state/cache"
    assert foreign_entries(checkpoint.files) == [named]
    with pytest.raises(CheckpointError, match=f"it holds what neither Spark nor eos wrote: {named}"):
        checkpoint.check_deletable()
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted([*SPARK_AND_EOS, foreign])


def test_a_checkpoint_that_is_a_file_is_refused(tmp_path: Path):
    (tmp_path / "ck").write_text("not a folder")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint folder"):
        Checkpoint(str(tmp_path / "ck")).check_deletable()


def test_the_pipeline_files_folder_is_refused_even_when_it_holds_only_a_checkpoint(tmp_path: Path):
    root = lay_out(tmp_path / "project", SPARK_AND_EOS)
    with pytest.raises(ConfigError, match="is the folder of the pipeline file"):
        Checkpoint(str(root)).check_deletable(root / "pipeline.yaml")


def test_delete_takes_spark_and_eos_files_and_then_the_empty_folder(tmp_path: Path):
    root = lay_out(tmp_path / "ck", SPARK_AND_EOS)
    (tmp_path / "beside.txt").write_text("kept")
    assert Checkpoint(str(root)).delete() is True
    assert not root.exists() and (tmp_path / "beside.txt").read_text() == "kept"
    assert Checkpoint(str(tmp_path / "never-made")).delete() is True


def test_delete_leaves_what_appeared_after_the_check_and_keeps_the_folder(tmp_path: Path):
    root = lay_out(tmp_path / "ck", [*SPARK_AND_EOS, "appeared.txt"])
    os.symlink(tmp_path / "elsewhere", root / "state" / "2")  # a link goes, never what it points to
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "kept").write_text("kept")
    assert Checkpoint(str(root)).delete() is False
    assert [p.name for p in root.iterdir()] == ["appeared.txt"]
    assert (tmp_path / "elsewhere" / "kept").read_text() == "kept"


# -- the metadata is private --------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_metadata_is_written_private_and_an_old_checkpoints_is_made_private(tmp_path: Path):
    root = tmp_path / "ck"
    (root / "_eos").mkdir(parents=True, mode=0o755)
    os.chmod(root / "_eos", 0o755)  # as an earlier eos left it
    (root / "_eos" / "pipeline.json").write_text("{}")
    os.chmod(root / "_eos" / "pipeline.json", 0o644)
    checkpoint = Checkpoint(str(root))
    checkpoint.write_meta(CheckpointMeta("p", "id", "exactly-once", {}, {}, "digest"))
    assert (mode(root / "_eos"), mode(root / "_eos" / "pipeline.json")) == (0o700, 0o600)
    assert checkpoint.read_meta().pipeline == "p"
    assert [p.name for p in (root / "_eos").iterdir()] == ["pipeline.json"]  # no temporary file left


# -- scratch folders ----------------------------------------------------------------------------------


def test_a_local_checkpoints_scratch_folder_is_private(tmp_path: Path):
    folder = Checkpoint(str(tmp_path / "ck")).scratch_dir()
    assert folder == tmp_path / "ck" / "_eos" / "scratch"
    assert (mode(folder.parent), mode(folder)) == (0o700, 0o700)


def test_a_remote_checkpoints_scratch_folder_is_made_fresh_and_private(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    folder = private_folder(scratch_dir("hdfs://nn:8020/eos/orders"))
    assert folder.parent == tmp_path and folder.name.startswith("eos-scratch-")
    assert mode(folder) == 0o700 and folder.stat().st_uid == os.geteuid()
    assert private_folder(folder) == folder  # the same folder, next time


def test_a_link_in_place_of_a_private_folder_is_refused(tmp_path: Path):
    (tmp_path / "theirs").mkdir()
    os.symlink(tmp_path / "theirs", tmp_path / "eos-scratch-x")
    with pytest.raises(CheckpointError, match="is a link"):
        private_folder(tmp_path / "eos-scratch-x")

"""`eos reset` deletes only what eos and Spark wrote (issue 35, "Nothing destroyed"): a checkpoint
location that could hold anything else is refused before anything is fenced or deleted, and a
ledger topic shared by several pipelines keeps the others' entries. A real broker; no Spark (the
checkpoints here are laid out by hand, the ledger entries written with the ledger module; a reset
of a checkpoint Spark wrote, and the run after it, are in test_lifecycle.py and
test_postgres_sink.py). The decision logic alone: tests/unit/test_checkpoint_safety.py."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from eos.cli import main as eos_main
from eos.errors import CheckpointError
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.decision import Decision, DriverInfo
from eos.protocol.ledger import LedgerEntry
from eos_connectors.kafka.clients import producer
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.ledger import ensure_ledger_topic, entry_key, read_ledger
from tests.pipelines import passthrough_pipeline, write_pipeline


def project(folder: Path, name: str, bootstrap: str, checkpoint: str, **extra) -> Path:
    """A project folder: its pipeline file, a source file and a SQL file beside it."""
    config = passthrough_pipeline(name, bootstrap, f"{name}-in", f"{name}-out", Path("unused"))
    config["checkpoint"] = checkpoint
    config.update(extra)
    path = write_pipeline(folder, config)
    (folder / "transform.sql").write_text("SELECT * FROM events")
    (folder / "src").mkdir()
    (folder / "src" / "udfs.py").write_text("def f(): ...\n")
    return path


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def topics(admin) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def refused(path: Path, capsys) -> tuple[int, str]:
    code = eos_main(["reset", str(path), "--yes"])
    return code, capsys.readouterr().err


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    """For locations whose deletion would be a disaster on an unfixed eos: nothing may be deleted
    (from when the test's own folder is made)."""

    def never(*args, **kwargs):
        raise AssertionError(f"eos reset tried to delete {args}")

    for module, name in ((shutil, "rmtree"), (os, "unlink"), (os, "remove"), (os, "rmdir")):
        monkeypatch.setattr(module, name, never)
    monkeypatch.setattr(Path, "unlink", never)
    monkeypatch.setattr(Path, "rmdir", never)


def test_the_pipeline_files_folder_is_refused_and_nothing_is_touched(admin, bootstrap, unique_name, tmp_path, capsys):
    """Reproduced: with `checkpoint: .` a reset deleted the whole project, its YAML and sources."""
    name = unique_name("p")
    path = project(tmp_path / "project", name, bootstrap, ".")
    before = files_of(tmp_path / "project")
    code, err = refused(path, capsys)
    assert code == 2, err
    assert f"is the folder of the pipeline file {path}" in err and "checkpoint folder of its own" in err
    assert files_of(tmp_path / "project") == before
    assert f"eos-ledger-{name}.control" not in topics(admin)  # refused before the take-over


def test_a_folder_above_the_pipeline_file_is_refused(admin, bootstrap, unique_name, tmp_path, capsys):
    name = unique_name("p")
    path = project(tmp_path / "project" / "pipelines", name, bootstrap, "..")
    before = files_of(tmp_path / "project")
    code, err = refused(path, capsys)
    assert code == 2 and f"{tmp_path / 'project'} holds the folder of the pipeline file" in err, err
    assert files_of(tmp_path / "project") == before
    assert f"eos-ledger-{name}.control" not in topics(admin)


@pytest.mark.parametrize("written", ["~", "HOME"])
def test_the_home_folder_is_refused(admin, bootstrap, unique_name, tmp_path, capsys, monkeypatch, written):
    """`~` (meant as the home folder, though a pipeline file does not expand it) and the home
    folder's own path. HOME is a folder of the test's."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    monkeypatch.setenv("HOME", str(home))
    name = unique_name("p")
    path = project(tmp_path / "project", name, bootstrap, "~" if written == "~" else str(home))
    code, err = refused(path, capsys)
    assert code == 2 and "is your home folder" in err, err
    assert (home / ".ssh" / "id_ed25519").read_text() == "key"
    assert f"eos-ledger-{name}.control" not in topics(admin)


def test_the_filesystem_root_is_refused_without_touching_anything(guarded, unique_name, tmp_path, capsys):
    """Nothing may be deleted (`guarded`), and the broker is unreachable: a refusal must come
    before eos asks Kafka anything."""
    path = project(tmp_path / "project", unique_name("p"), "127.0.0.1:1", "/")
    code, err = refused(path, capsys)
    assert code == 2 and "/ is the filesystem's root" in err, err


def test_a_checkpoint_folder_holding_anything_else_is_refused(admin, bootstrap, unique_name, tmp_path, capsys):
    name = unique_name("p")
    checkpoint = tmp_path / "data"
    Checkpoint(str(checkpoint)).write_meta(CheckpointMeta(name, "ck1", "exactly-once", {}, {}, "d"))
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n")
    (checkpoint / "customers.csv").write_text("id,name\n")
    path = project(tmp_path / "project", name, bootstrap, str(checkpoint))
    before = files_of(checkpoint)
    code, err = refused(path, capsys)
    # exit 3: refused, with what to decide (README, exit codes)
    assert code == 3 and "it holds what neither Spark nor eos wrote: customers.csv" in err, err
    assert "move the others out" in err
    assert files_of(checkpoint) == before
    assert f"eos-ledger-{name}.control" not in topics(admin)


# -- a ledger topic shared by two pipelines ---------------------------------------------------------


def entries_for(client: dict, topic: str, pipeline: str, slots: int = 2) -> dict:
    """Ledger entries of `pipeline`'s sink `out`, as its slots would write them (in the topic's own
    partitioning: a keyed record, no explicit partition)."""
    out = producer({**client, "enable.idempotence": True})
    written = {}
    for slot in range(slots):
        entry = LedgerEntry(pipeline, "out", slot, 7, f"ck-{pipeline}", "o" * 64, "c" * 64, run="r1", records=10)
        out.produce(topic, entry.to_json().encode(), entry_key(pipeline, "out", slot))
        written[("out", slot)] = entry
    assert out.flush(30) == 0
    return written


def control_records(client: dict, topic: str, pipeline: str) -> None:
    log = KafkaControlLog(client, topic, pipeline)
    try:
        log.take_over(DriverInfo("r1", socket.gethostname(), 1, "127.0.0.1:1"))  # a driver that has stopped
        log.record_decision(Decision(7, 1, "r1", {"out": [f"{pipeline}-handle"]}))
    finally:
        log.close()


def test_a_shared_ledger_topic_keeps_the_other_pipelines_entries(admin, bootstrap, unique_name, tmp_path):
    """Two pipelines, one `ledger.topic` (and so one control topic). Resetting one forgets its
    entries and control records, and only its: the topics stay, the other pipeline's entries and
    records are as they were, and the reset pipeline's readers find no entry (tombstones)."""
    client = {"bootstrap.servers": bootstrap}
    shared = unique_name("ledger")
    ensure_ledger_topic(client, shared)
    first, second = unique_name("a"), unique_name("b")
    written = {name: entries_for(client, shared, name) for name in (first, second)}
    for name in (first, second):
        control_records(client, f"{shared}.control", name)
    assert read_ledger(client, shared, first) == written[first]

    path = project(tmp_path / first, first, bootstrap, str(tmp_path / first / "ck"), ledger={"topic": shared})
    assert eos_main(["reset", str(path), "--yes"]) == 0

    assert {shared, f"{shared}.control"} <= topics(admin)
    assert read_ledger(client, shared, second) == written[second]
    assert read_ledger(client, shared, first) == {}
    kept = KafkaControlLog(client, f"{shared}.control", second).state()
    assert kept.previous is not None and kept.previous.run == "r1"
    assert kept.decision is not None and kept.decision.prepared == {"out": [f"{second}-handle"]}
    forgotten = KafkaControlLog(client, f"{shared}.control", first).state()
    assert (forgotten.previous, forgotten.decision, forgotten.pools) == (None, None, {})

    # A reset with nothing left to forget forgets nothing of the other pipeline either.
    assert eos_main(["reset", str(path), "--yes"]) == 0
    assert read_ledger(client, shared, second) == written[second]


# -- through Hadoop's FileSystem API -------------------------------------------------------------------


def test_a_checkpoint_through_hadoops_filesystem_is_checked_deleted_and_its_metadata_private(spark, tmp_path):
    """The path remote checkpoints take (eos.protocol.checkpoint._HadoopFiles), on Hadoop's local
    filesystem: it writes checksums beside every file (.NAME.crc), which belong to the file.
    On HDFS: tests/cluster/test_hdfs.py."""
    import stat

    from eos.protocol.checkpoint import _HadoopFiles
    from tests.unit.test_checkpoint_safety import SPARK_AND_EOS, lay_out

    root = lay_out(tmp_path / "ck", [rel for rel in SPARK_AND_EOS if not rel.startswith("_eos/")])
    checkpoint = Checkpoint(str(root))
    checkpoint.files = _HadoopFiles(f"file://{root}", spark._jvm, spark._jsc.hadoopConfiguration())
    checkpoint.write_meta(CheckpointMeta("p", "ck1", "exactly-once", {}, {}, "d"))
    assert stat.S_IMODE((root / "_eos").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "_eos" / "pipeline.json").stat().st_mode) == 0o600
    assert (root / "_eos" / ".pipeline.json.crc").exists()
    checkpoint.check_deletable()  # Spark's, eos's and Hadoop's checksums only

    (root / "state" / "notes").write_text("mine")
    with pytest.raises(CheckpointError, match="it holds what neither Spark nor eos wrote: state/notes"):
        checkpoint.check_deletable()
    (root / "state" / "notes").unlink()
    (tmp_path / "beside").write_text("kept")
    assert checkpoint.delete() is True
    assert [p.name for p in tmp_path.iterdir()] == ["beside"]

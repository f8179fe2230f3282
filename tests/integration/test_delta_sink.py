"""The Delta Lake sink on a real broker, a real local Spark (in process) and a local Delta table.

Output is read back by readers that share no code with eos: delta-rs's own reader, and Spark's
own Delta reader (delta-spark, in a process of its own: tests/support_delta.py). Every input
record is in the table once (append, partitioned); upsert keeps one row per key with the
totals; one Delta version per epoch, holding the app transaction; nothing staged is left; and
the errors a user meets first, before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from eos.cli import main as eos_main
from eos.config import load_pipeline
from eos.declared import connectors, pipeline_info
from eos.errors import ConfigError, Permanent, SlotAborted
from eos.protocol.ledger import LedgerEntry
from eos_connectors.delta import ledger, staging
from eos_connectors.delta import sink as delta_sink
from eos_connectors.delta.sink import DeltaSink
from eos_ops.verify_pipeline import verify_pipeline
from tests.pipelines import assert_exactly_once, produce_numbered, run_in_process, write_pipeline
from tests.support_delta import delta_ids, spark_delta_reader

ID_COLUMNS = {"id": "value", "k": "key", "src_partition": "partition", "src_offset": "offset"}


def delta_pipeline(
    name: str, bootstrap: str, topic: str, checkpoint: Path, table: Path, *, delta: dict[str, Any] | None = None,
    sql_transform: str | None = None, max_records_per_epoch: int = 500, **epochs: Any,
) -> dict[str, Any]:  # fmt: skip
    config: dict[str, Any] = {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s", **epochs},
        "sources": [
            {
                "name": "events",
                "key_format": "string",
                "value_format": "string",
                "kafka": {"bootstrap": bootstrap, "topics": [topic], "max_records_per_epoch": max_records_per_epoch},
            }
        ],
        "sinks": [
            {
                "name": "lake",
                "delta": {"table": str(table), "create_table": True, "columns": ID_COLUMNS} | (delta or {}),
            }
        ],
    }
    if sql_transform:
        config["transforms"] = [{"name": "shaped", "sql": sql_transform}]
    return config


def eos_commits(table: Path, pipeline: str) -> list[dict[str, Any]]:
    """The eos entries of the table's commitInfos, oldest first (read from the log by delta-rs)."""
    return [
        c["eos"] for c in reversed(DeltaTable(str(table)).history()) if c.get("eos", {}).get("pipeline") == pipeline
    ]


def staged_files(table: Path) -> list[str]:
    root = table / staging.ROOT
    return sorted(str(p.relative_to(table)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture(scope="module")
def spark_delta():
    return spark_delta_reader()


# ---------------------------------------------------------------------------------------------
# Exactly once: append and upsert
# ---------------------------------------------------------------------------------------------


def test_append_writes_every_record_once_in_one_version_per_epoch(
    spark, bootstrap, new_topic, unique_name, tmp_path, spark_delta
):
    """A partitioned table; epoch 1's commit fails in the driver right after the decision
    (failpoint `raise` at sink.after_agreement): recovery, resuming the recorded decision, commits
    the staged files, and the retry finds every slot committed. Each epoch is ONE Delta version
    with the app transaction; both readers see every record once; nothing staged is left."""
    source = new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 1200)
    name, table = unique_name("p"), tmp_path / "lake"
    config = delta_pipeline(name, bootstrap, source, tmp_path / "ck", table, delta={"partition_by": ["src_partition"]})
    path = write_pipeline(tmp_path, config)
    result = run_in_process(spark, path, failpoints=["sink.after_agreement=raise@epoch=1"])

    assert result.epochs_committed >= 3  # 1200 records at <= 500 an epoch
    assert_exactly_once(sent, delta_ids(table))
    assert_exactly_once(sent, spark_delta.ids(table))
    commits = eos_commits(table, name)
    assert [c["epoch"] for c in commits] == list(range(result.epochs_committed))  # one version per epoch
    assert all(sorted(c["slots"]) == ["0", "1"] for c in commits), commits
    assert DeltaTable(str(table)).transaction_version(ledger.app_id(name, "lake")) == result.epochs_committed - 1
    assert DeltaTable(str(table)).metadata().partition_columns == ["src_partition"]
    assert sorted(p.name for p in table.iterdir() if p.name.startswith("src_partition=")) == [
        "src_partition=0", "src_partition=1", "src_partition=2",
    ]  # fmt: skip
    data = [p.name for p in table.rglob("*.parquet") if "_eos_staged" not in str(p)]
    assert data and all(n.startswith("eos-e") for n in data), data
    assert staged_files(table) == []
    # Spark's reader prunes partitions and skips files by eos's statistics: still every record.
    some = spark_delta.read(table, ["id", "src_partition", "src_offset"])
    assert Counter(r["src_partition"] for r in some) == Counter(int(r["src_partition"]) for r in delta_rows(table))

    # eos verify reads the table with delta-rs and finds every record once; then one row appended
    # a second time (by another writer) is reported duplicated.
    lake = verified(spark, path, table, ok=True)
    assert (lake.expected, lake.output_records, lake.semantics) == (1200, 1200, "every row exactly once")
    write_deltalake(str(table), DeltaTable(str(table)).to_pyarrow_table().slice(0, 1), mode="append")
    lake = verified(spark, path, table, ok=False)
    assert len(lake.duplicated) == 1 and not (lake.lost or lake.unexpected or lake.wrong), lake.duplicated


def verified(spark: Any, path: Path, table: Path, ok: bool) -> Any:
    """`eos verify`'s report on the pipeline, checked for `ok`; its check of the sink `lake`."""
    report = verify_pipeline(path, spark=spark)
    text = "\n".join(report.lines())
    assert report.ok is ok, text
    lake = next(check for check in report.checks if check.name == "sink lake")
    assert lake.target == f"Delta table {table}", text
    return lake


def delta_rows(table: Path) -> list[dict[str, Any]]:
    from eos_ops.delta import read_table

    return read_table(table)


def test_upsert_merges_one_row_per_key_with_the_totals(spark, bootstrap, new_topic, unique_name, tmp_path, spark_delta):
    """A streaming count per key in Spark's update mode: each epoch MERGEs the keys it changed.
    Run twice (new input in between): one row per key with the input's totals, in both readers."""
    source = new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 900, keys=13)
    name, table = unique_name("p"), tmp_path / "lake"
    config = delta_pipeline(
        name, bootstrap, source, tmp_path / "ck", table,
        delta={"mode": "upsert", "key": ["k"], "columns": None},
        sql_transform="SELECT key AS k, count(*) AS n, max(value) AS last_value FROM events GROUP BY key",
        output_mode="update", max_records_per_epoch=300,
    )  # fmt: skip
    path = write_pipeline(tmp_path, config)
    run_in_process(spark, path)
    produce_numbered(bootstrap, source, 900, 400, keys=13)
    run_in_process(spark, path)

    expected = dict(Counter(f"k{i % 13}" for i in range(1300)))
    for rows in (delta_rows(table), spark_delta.read(table)):
        assert len(rows) == 13
        assert {r["k"]: r["n"] for r in rows} == expected
    assert staged_files(table) == []
    assert all(c["epoch"] == i for i, c in enumerate(eos_commits(table, name)))
    lake = verified(spark, path, table, ok=True)
    assert (lake.expected, lake.output_records) == (13, 13)
    assert lake.semantics == "upsert: the last value per key (k) counts"


def test_a_key_twice_in_an_epoch_stops_before_the_decision(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Upsert by the Kafka key of a stateless pipeline: an epoch holds each key many times. The
    pipeline stops with a clear error before the decision: nothing of the epoch is in the table,
    nothing is left staged."""
    source = new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 200, keys=5)
    name, table = unique_name("p"), tmp_path / "lake"
    config = delta_pipeline(name, bootstrap, source, tmp_path / "ck", table, delta={"mode": "upsert", "key": ["k"]})
    with pytest.raises(Permanent, match=r"more than one row.*one row per key per epoch") as error:
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert "deduplicate" in (error.value.hint or "")
    assert delta_rows(table) == []
    assert eos_commits(table, name) == []
    assert staged_files(table) == []


# ---------------------------------------------------------------------------------------------
# Errors a user meets first
# ---------------------------------------------------------------------------------------------


def test_rows_that_do_not_fit_the_table_are_refused_up_front(spark, bootstrap, new_topic, unique_name, tmp_path):
    source = new_topic()
    table = tmp_path / "lake"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64()), "k": ["x"]}))
    config = delta_pipeline(unique_name("p"), bootstrap, source, tmp_path / "ck", table)
    with pytest.raises(ConfigError, match=r"has no column 'src_partition', 'src_offset'"):
        run_in_process(spark, write_pipeline(tmp_path, config))
    config["sinks"][0]["delta"]["columns"] = {"id": "value", "k": "key"}
    with pytest.raises(ConfigError, match=r"id is long in the table, string in the rows") as error:
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert "CAST" in (error.value.hint or "")
    config["sinks"][0]["delta"] |= {"table": str(tmp_path / "none"), "create_table": False}
    with pytest.raises(ConfigError, match=r"there is no Delta table at .*none"):
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert len(DeltaTable(str(table)).history()) == 1  # nothing written


def test_storage_options_never_show():
    from eos_connectors import delta

    entry = delta.Sink(
        "lake", table="s3://bucket/t", storage_options={"AWS_SECRET_ACCESS_KEY": "hunter2", "AWS_REGION": "x"}
    )
    assert "hunter2" not in json.dumps(entry.model_dump(mode="json"))
    with pytest.raises(ConfigError, match="credentials in `storage_options`"):
        delta.Sink("lake", table="s3://user:hunter2@bucket/t")
    with pytest.raises(ConfigError, match="needs `key"):
        delta.Sink("lake", table="/t", mode="upsert")


# ---------------------------------------------------------------------------------------------
# The commit path: a concurrent writer; what lingers; cleanup and reset
# ---------------------------------------------------------------------------------------------


class Ctx:
    """What the protocol tells a slot writer (a plain value; the writer and table are real)."""

    def __init__(self, pipeline: Any, sink: str, slot: int, epoch: int, attempt: int = 1):
        self.pipeline, self.sink, self.slot, self.epoch, self.attempt = pipeline, sink, slot, epoch, attempt
        self.task_attempt, self.worker = 0, "test"


def staged_sink(tmp_path: Path, name: str, bootstrap: str, topic: str) -> tuple[Path, DeltaSink, Any]:
    """A pipeline file with a Delta sink whose table exists, its connector with rows() done."""
    table = tmp_path / "lake"
    path = write_pipeline(tmp_path, delta_pipeline(name, bootstrap, topic, tmp_path / "ck", table))
    config = load_pipeline(path)
    found = connectors(config, pipeline_info(config, "ck0", tmp_path))
    sink = found.sinks[0]
    assert isinstance(sink, DeltaSink)
    schema = pa.schema(
        [("id", pa.string()), ("k", pa.string()), ("src_partition", pa.int32()), ("src_offset", pa.int64())]
    )
    DeltaTable.create(str(table), schema)
    sink._prepare_table(schema)
    return path, sink, schema


def stage(sink: DeltaSink, schema: pa.Schema, epoch: int, slot: int, ids: list[str], attempt: int = 1) -> Any:
    ctx = Ctx(sink.pipeline, sink.name, slot, epoch, attempt)
    writer = sink.writer().open(ctx)
    writer.write(pa.RecordBatch.from_pydict(
        {"id": ids, "k": ["k"] * len(ids), "src_partition": [slot] * len(ids), "src_offset": list(range(len(ids)))},
        schema=schema,
    ))  # fmt: skip
    entry = LedgerEntry(sink.pipeline.name, sink.name, slot, epoch, "ck0", "off", "cfg", attempt, "run", len(ids))
    return writer.precommit(entry)


def commit_twice_at_once(sink: DeltaSink, staged: list, monkeypatch) -> list[BaseException]:
    """Two threads commit the same staged attempts, both past the sink's check before either
    commits (a barrier between the check and the commit); what they raised."""
    barrier = threading.Barrier(2)
    monkeypatch.setattr(delta_sink, "_between_check_and_commit", lambda _: barrier.wait(30))
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            sink._commit(sink._manifests(staged))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_a_concurrent_writer_of_the_app_id_cannot_make_eos_commit_twice(
    bootstrap, new_topic, unique_name, tmp_path, monkeypatch
):
    """Between eos's check of the app transaction and its commit, another writer commits the same
    app id and epoch (a zombie driver, or anything else): delta-rs's conflict check refuses eos's
    commit, so epoch 3's rows are not added a second time. And a commit that runs twice at once
    (two drivers executing one decision) adds the rows once."""
    _, sink, schema = staged_sink(tmp_path, unique_name("p"), bootstrap, new_topic())
    prepared = [stage(sink, schema, 3, 0, ["a", "b"]), stage(sink, schema, 3, 1, ["c"])]

    def zombie(table: DeltaTable) -> None:  # commits app id @ epoch 3 right after eos's check
        monkeypatch.setattr(delta_sink, "_between_check_and_commit", lambda _: None)
        write_deltalake(
            sink.uri, pa.table({"id": ["z"]}), mode="append", schema_mode="merge",
            commit_properties=CommitProperties(app_transactions=[Transaction(sink.app_id, 3)]),
        )  # fmt: skip

    monkeypatch.setattr(delta_sink, "_between_check_and_commit", zombie)
    with pytest.raises(SlotAborted, match="another writer committed"):
        sink.commit(prepared)
    assert sorted(str(r["id"]) for r in delta_rows(tmp_path / "lake")) == ["z"]

    # Two commits of the same staged files at once: one version adds them, the other finds them.
    again = [stage(sink, schema, 4, 0, ["d"]), stage(sink, schema, 4, 1, ["e", "f"])]
    assert commit_twice_at_once(sink, again, monkeypatch) == []
    assert sorted(str(r["id"]) for r in delta_rows(tmp_path / "lake")) == ["d", "e", "f", "z"]
    assert sum(1 for c in DeltaTable(sink.uri).history() if c.get("eos", {}).get("epoch") == 4) == 1


def test_lingering_staged_files_are_listed_cleaned_up_and_reset(bootstrap, new_topic, unique_name, tmp_path):
    """An attempt staged and never decided: invisible to readers, listed by `eos status`, removed
    by `eos delta cleanup` (data files and staging files). Then `eos reset` forgets the table's
    app transaction in an empty version, so the next run starts over."""
    name = unique_name("p")
    path, sink, schema = staged_sink(tmp_path, name, bootstrap, new_topic())
    committed = stage(sink, schema, 0, 0, ["a"])
    sink.commit([committed])
    stage(sink, schema, 1, 0, ["b", "c"])
    # A writer that died mid-write: a data file and its note, no manifest.
    dying = sink.writer().open(Ctx(sink.pipeline, sink.name, 1, 1, attempt=2))
    dying.write(
        pa.RecordBatch.from_pydict({"id": ["x"], "k": ["k"], "src_partition": [1], "src_offset": [0]}, schema=schema)
    )
    for f in dying.files.values():
        f.finish(dying.store)
    assert sorted(str(r["id"]) for r in delta_rows(tmp_path / "lake")) == ["a"]
    lingering = sink.lingering()
    assert len(lingering) == 2 and any("incomplete" in line for line in lingering), lingering
    data_before = sorted(p.name for p in (tmp_path / "lake").glob("eos-*.parquet"))
    assert len(data_before) == 3

    status = io.StringIO()
    with contextlib.redirect_stdout(status):
        eos_main(["status", str(path)])
    assert all(line.split(":")[0] in status.getvalue() for line in lingering), status.getvalue()

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert eos_main(["delta", "cleanup", str(path)]) == 0
    assert out.getvalue().count("rolled back") == 2, out.getvalue()
    assert staged_files(tmp_path / "lake") == []
    assert len(list((tmp_path / "lake").glob("eos-*.parquet"))) == 1  # the committed one stays
    assert sink.lingering() == []
    assert DeltaSink.read_ledger([sink])[("lake", 0)].epoch == 0

    sink.forget()
    assert DeltaSink.read_ledger([sink]) == {}
    assert DeltaTable(sink.uri).transaction_version(sink.app_id) == ledger.NOTHING
    assert sorted(str(r["id"]) for r in delta_rows(tmp_path / "lake")) == ["a"]  # its rows stay


def test_vacuum_spares_the_staging_folder_and_a_vacuumed_file_is_never_committed(
    bootstrap, new_topic, unique_name, tmp_path
):
    """VACUUM with no retention (what docs/DELTA.md says never to run while an epoch is in flight)
    deletes an append's staged data file, but nothing under _eos_staged/. Recovery then does not
    commit a version naming the missing file, even though the decision names it: it removes the
    attempt, and the replay writes the slot again."""
    from eos.protocol.decision import Decision

    _, sink, schema = staged_sink(tmp_path, unique_name("p"), bootstrap, new_topic())
    lost = stage(sink, schema, 0, 1, ["b"])
    table = DeltaTable(sink.uri)
    vacuumed = table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
    assert len(vacuumed) == 1 and vacuumed[0].startswith("eos-e0-a1-s1-"), vacuumed
    assert len(staged_files(tmp_path / "lake")) == 2  # its manifest and note survive
    kept = stage(sink, schema, 0, 0, ["a"])

    decision = Decision(0, 1, "run", {"lake": [kept.handle, lost.handle]})
    done = dict(sink.resolve_staged(decision))
    assert done == {kept.handle: "committed", lost.handle: "rolled back"}, done
    assert [r["id"] for r in delta_rows(tmp_path / "lake")] == ["a"]
    assert sorted(DeltaSink.read_ledger([sink])) == [("lake", 0)]  # the replay writes slot 1 again
    assert staged_files(tmp_path / "lake") == []


def test_the_python_api_declares_a_delta_sink(spark, bootstrap, new_topic, unique_name, tmp_path):
    """`delta.Sink(...)` in a pipeline built in code: the same sink as a file's `delta:` section."""
    import eos
    from eos_connectors import delta, kafka

    source = new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 300)
    pipeline = eos.Pipeline(unique_name("api"), tmp_path / "ck", spark=spark, epochs=eos.Epochs(slots=2, timeout="60s"))
    events = pipeline.source(
        kafka.Source("events", bootstrap=bootstrap, topics=[source], key_format="string", value_format="string")
    )
    lake = tmp_path / "lake"
    pipeline.sink(events.selectExpr("value AS id", "key AS k"), delta.Sink("lake", table=str(lake), create_table=True))
    query = pipeline.start(trigger="available-now")
    query.awaitTermination(300)
    assert query.exception() is None
    assert_exactly_once(sent, delta_ids(lake))

"""The fault matrix of the Delta Lake sink: kill -9 at every protocol point, in ONE pipeline that
writes the same input to a Kafka topic, a PostgreSQL table and a Delta table, then restart with
`eos run --finish-pending`.

Each case is two cold `eos run` processes on a real broker, a real PostgreSQL and a local Delta
table: the first is killed (driver, Spark JVM, Python workers) at a failpoint of epoch 1, the
pipeline's last epoch; the second replays exactly the pending epoch and stops. Then:

- exactly once in the Delta table, read by readers that share no code with eos: delta-rs's own
  reader and Spark's own Delta reader (tests/support_delta.py); in the topic, a plain
  read_committed consumer and `eos verify`; in the PostgreSQL table, a plain query;
- atomicity across the three systems: the same records everywhere;
- one Delta version per epoch and sink (two when the crash fell between two slots' commits: the
  failpoint commits slot by slot), each with the app transaction, none twice;
- nothing is left staged: no manifest, and no data file in the table's folder that the log does
  not name; recovery said what it did: staged attempts of an undecided epoch removed, decided
  ones committed.

The mixed pipeline is the matrix: every protocol point, the task-side points and the driver's
commit points aimed at a Delta slot. A Delta-only pipeline (nothing to fence, nothing else to
resolve) repeats the point that commits the table in two versions: between two slots' commits
(the rest committed from the decision). The negative control runs a Delta-only pipeline at-least-once and must show
duplicates. The input topic is shared by every case (each pipeline reads it from the start).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from eos_connectors.delta import ledger, staging
from eos_connectors.delta.table import Store
from eos_connectors.kafka.clients import create_topic
from eos_ops.delta import read_table
from tests.faults.test_postgres_faults import eos_verify
from tests.pipelines import eos_subprocess, produce_numbered, write_pipeline
from tests.support import independent_committed_values
from tests.support_delta import spark_delta_reader

RECORDS = 900  # two epochs at <= 500 records each: the crash hits epoch 1, the last one
SLOTS = 2
# Sinks in order (Kafka, PostgreSQL, Delta): the Delta sink's rows are slots 2*SLOTS.. of an epoch.
DELTA_SLOT = {"mixed": 2 * SLOTS, "delta": 0}
CASES = [
    ("mixed", "epoch.after_offsets_logged"),
    ("mixed", "sink.mid_produce"),
    ("mixed", "sink.after_precommit"),
    ("mixed", "sink.after_agreement"),
    ("mixed", "sink.between_commits"),
    ("mixed", "epoch.after_commit"),
    ("delta", "sink.between_commits"),
]
AIMED = {"sink.mid_produce", "sink.after_precommit", "sink.after_agreement", "sink.between_commits"}


@pytest.fixture(scope="module")
def input_topic(bootstrap, admin) -> tuple[str, list[str]]:
    import uuid

    topic = f"delta-faults-in-{uuid.uuid4().hex[:8]}"
    assert create_topic(admin, topic, 2)
    return topic, produce_numbered(bootstrap, topic, 0, RECORDS)


@pytest.fixture(scope="module")
def spark_delta():
    return spark_delta_reader()


def pipeline(
    name: str, kind: str, bootstrap: str, source: str, topic: str, dsn: str, table: str, lake: Path, ck: Path,
    mode: str = "exactly-once",
) -> dict:  # fmt: skip
    sinks: list[dict] = []
    if kind == "mixed":
        sinks.append(
            {"name": "out", "kafka": {"bootstrap": bootstrap, "topic": topic}, "key": "key", "value": "value",
             "value_format": "string"}
        )  # fmt: skip
        sinks.append(
            {"name": "db", "input": "events",
             "postgres": {"dsn": dsn, "table": table, "create_table": True, "columns": {"id": "value", "k": "key"}}}
        )  # fmt: skip
    sinks.append(
        {"name": "lake", "input": "events",
         "delta": {"table": str(lake), "create_table": True, "partition_by": ["p"],
                   "columns": {"id": "value", "k": "key", "p": "partition"}}}
    )  # fmt: skip
    return {
        "name": name,
        "checkpoint": str(ck),
        "epochs": {"mode": mode, "trigger": "available-now", "slots": SLOTS, "timeout": "60s"},
        "sources": [
            {
                "name": "events",
                "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 500},
                "key_format": "string",
                "value_format": "string",
            }
        ],
        "sinks": sinks,
    }


def delta_ids(lake: Path) -> list[str]:
    """delta-rs's own reader: the log, then the Parquet files (no eos code)."""
    return [row["id"] for row in read_table(lake)]


def pg_ids(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table)))]


def orphans(lake: Path) -> list[str]:
    """Data files in the table's folder that its log does not name, and anything staged."""
    named = {uri.removeprefix(f"{lake}/") for uri in DeltaTable(str(lake)).file_uris()}
    on_disk = {str(p.relative_to(lake)) for p in lake.rglob("*.parquet") if staging.ROOT not in p.parts}
    staged = [str(p) for p in (lake / staging.ROOT).rglob("*") if p.is_file()] if (lake / staging.ROOT).exists() else []
    return sorted(on_disk - named) + staged


def resolved(output: str) -> tuple[int, int]:
    """What recovery said it did with the Delta sink's staged attempts: (committed, removed)."""
    found = re.findall(r"sink lake: committed (\d+) and removed (\d+) staged attempts", output)
    return (sum(int(c) for c, _ in found), sum(int(r) for _, r in found))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "point"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_kill_9_then_finish_pending(
    kind, point, bootstrap, new_topic, unique_name, postgres, input_topic, spark_delta, tmp_path
):
    started = time.monotonic()
    source, sent = input_topic
    name = unique_name("p")
    table = name.replace("-", "_").lower()[:60]
    topic = new_topic(partitions=2) if kind == "mixed" else ""
    lake = tmp_path / "lake"
    config = pipeline(name, kind, bootstrap, source, topic, postgres, table, lake, tmp_path / "ck")
    path = write_pipeline(tmp_path, config)

    condition = f"epoch=1,slot={DELTA_SLOT[kind]}" if point in AIMED else "epoch=1"
    crashed = eos_subprocess("run", str(path), "--failpoint", f"{point}=kill@{condition}")
    assert crashed.killed, f"the failpoint {point} did not fire:\n{crashed.output[-3000:]}"
    assert f"kill -9 at {point}" in crashed.output
    before = len(delta_ids(lake))
    left = [a.stem for a in staging.attempts(Store(str(lake), {}), name, "lake")]

    crash_s = time.monotonic() - started
    finished = eos_subprocess("run", str(path), "--finish-pending")
    restart_s = time.monotonic() - started - crash_s
    assert finished.returncode == 0, finished.output[-3000:]
    assert "was logged but not marked committed" in finished.output
    committed, removed = resolved(finished.output)
    # What the crash left staged, recovery resolved: decided attempts committed, the others removed.
    assert committed + removed == len(left), (left, finished.output[-3000:])
    if point in ("sink.after_precommit", "sink.mid_produce"):
        assert removed >= 1 and committed == 0, left  # staged, never decided
    elif point in ("sink.after_agreement", "sink.between_commits"):
        assert committed >= 1 and removed == 0, left  # decided: resumed, not written again
    else:
        assert (committed, removed) == (0, 0), left

    # Exactly once in the Delta table, by delta-rs's reader and by Spark's.
    in_lake = delta_ids(lake)
    assert Counter(in_lake) == Counter(sent)
    assert spark_delta.ids(lake) == Counter(sent)
    assert orphans(lake) == []
    epochs = [c["eos"]["epoch"] for c in reversed(DeltaTable(str(lake)).history()) if "eos" in c]
    # One version per epoch; one per slot while the failpoint orders the commits slot by slot.
    assert epochs == ([0, 0, 1, 1] if point == "sink.between_commits" else [0, 1]), epochs
    assert DeltaTable(str(lake)).transaction_version(ledger.app_id(name, "lake")) == 1
    if kind == "mixed":
        # Atomicity across systems: the same records in the topic, the PostgreSQL table and the lake.
        in_topic = independent_committed_values(bootstrap, topic)
        in_pg = pg_ids(postgres, table)
        assert set(in_topic) == set(in_pg) == set(in_lake)
        assert Counter(in_topic) == Counter(in_pg) == Counter(sent)
        report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", topic)
        assert report["ok"] and (report["lost"], report["duplicated"]) == (0, 0), report
    print(
        f"{kind} {point}: crashed run {crash_s:.0f} s (the lake had {before} rows), --finish-pending {restart_s:.0f} s;"
        f" staged attempts left {len(left)}: committed {committed}, removed {removed}"
    )


@pytest.mark.slow
def test_negative_control_at_least_once_duplicates_are_caught(bootstrap, unique_name, input_topic, tmp_path):
    """The same crash without the protocol: slot 0 of epoch 1 committed its own Delta version,
    then kill -9; the restart replays the whole epoch and appends it again. delta-rs's reader must
    see the duplicates: the checks above can fail."""
    source, sent = input_topic
    name = unique_name("p")
    lake = tmp_path / "lake"
    config = pipeline(name, "delta", bootstrap, source, "", "", "", lake, tmp_path / "ck", mode="at-least-once")
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1,slot=0")
    assert crashed.killed and "kill -9 at sink.between_commits" in crashed.output, crashed.output[-3000:]
    finished = eos_subprocess("run", str(path), "--finish-pending")
    assert finished.returncode == 0, finished.output[-3000:]
    seen = Counter(delta_ids(lake))
    duplicated = {value for value, n in seen.items() if n > 1}
    assert set(seen) == set(sent) and duplicated, "at-least-once never loses; this crash must duplicate"

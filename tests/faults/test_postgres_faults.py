"""The fault matrix of the PostgreSQL sink: kill -9 at every protocol point, alone and next to a
Kafka sink of the same input, then restart with `eos run --finish-pending`.

Each case is two cold `eos run` processes on a real broker and a real PostgreSQL: the first is
killed (driver, Spark JVM, Python workers) at a failpoint of epoch 1, the pipeline's last epoch;
the second replays exactly the pending epoch and stops, which here means it has caught up. Then:

- atomicity across systems: the table and the topic hold exactly the same set of input records
  (before the restart they may differ: a crash after the decision leaves an epoch committed in
  one system and not yet in the other; that is allowed only while the driver is down);
- exactly once in both systems, by id: checked by `eos verify` (topic and table) and by readers
  that share no code with eos (a plain psycopg query; a plain read_committed consumer);
- no prepared transaction of the pipeline is left, and recovery said what it resolved: a crash
  after PREPARE without a decision is rolled back, one after the decision is committed.

The mixed pipeline is the matrix: every point, with the task-side points aimed at a PostgreSQL
slot and the driver-side commit points at a PostgreSQL commit. A PostgreSQL-only pipeline
(recovery resolves prepared transactions with no Kafka sink to fence) repeats the two points that
leave prepared transactions of both fates behind: after PREPARE without a decision (rolled back),
and between two slots' commits (the rest committed from the decision). The input topic is shared
by every case (each pipeline reads it from the start).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from eos.cli import main as eos_main
from eos_connectors.kafka.clients import create_topic
from eos_connectors.postgres.sink import prepared_xacts
from tests.pipelines import eos_subprocess, produce_numbered, write_pipeline
from tests.support import independent_committed_values

RECORDS = 900  # two epochs at <= 500 records each: the crash hits epoch 1, the last one
SLOTS = 2
# (pipeline, point, failpoint condition). In the mixed pipeline the Kafka sink comes first, so
# its rows are slots 0..SLOTS-1 of each epoch and the PostgreSQL sink's are SLOTS..2*SLOTS-1.
PG_SLOT = {"mixed": SLOTS, "pg": 0}
CASES = [
    ("mixed", "epoch.after_offsets_logged"),
    ("mixed", "sink.mid_produce"),
    ("mixed", "sink.after_precommit"),
    ("mixed", "sink.after_agreement"),
    ("mixed", "sink.between_commits"),
    ("mixed", "epoch.after_commit"),
    ("pg", "sink.after_precommit"),
    ("pg", "sink.between_commits"),
]
AIMED = {"sink.mid_produce", "sink.after_precommit", "sink.after_agreement", "sink.between_commits"}


@pytest.fixture(scope="module")
def input_topic(bootstrap, admin) -> tuple[str, list[str]]:
    import uuid

    topic = f"pg-faults-in-{uuid.uuid4().hex[:8]}"
    assert create_topic(admin, topic, 2)
    return topic, produce_numbered(bootstrap, topic, 0, RECORDS)


def pipeline(
    name: str, kind: str, bootstrap: str, source: str, topic: str, dsn: str, table: str, ck: Path,
    mode: str = "exactly-once",
) -> dict:  # fmt: skip
    sinks: list[dict] = []
    if kind == "mixed":
        sinks.append(
            {
                "name": "out",
                "kafka": {"bootstrap": bootstrap, "topic": topic},
                "key": "key",
                "value": "value",
                "value_format": "string",
            }
        )
    sinks.append(
        {"name": "db", "input": "events",
         "postgres": {"dsn": dsn, "table": table, "create_table": True, "columns": {"id": "value", "k": "key"}}}
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


def table_ids(dsn: str, table: str) -> list[str]:
    """The table's ids by a plain query: no eos code."""
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table)))]


def eos_verify(*args: str) -> dict:
    """`eos verify --json ...` (in this process: the same command, without a Python start-up)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = eos_main(["verify", "--json", *args])
    report = json.loads(out.getvalue())
    assert (code == 0) == report["ok"], out.getvalue()
    return report


def resolved(output: str) -> tuple[int, int]:
    """What recovery said it resolved: (committed, rolled back) prepared transactions."""
    found = re.findall(r"committed (\d+) and rolled back (\d+) prepared transactions", output)
    return (sum(int(c) for c, _ in found), sum(int(r) for _, r in found))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "point"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_kill_9_then_finish_pending(kind, point, bootstrap, new_topic, unique_name, postgres, input_topic, tmp_path):
    started = time.monotonic()
    source, sent = input_topic
    name = unique_name("p")
    table = name.replace("-", "_").lower()[:60]
    topic = new_topic(partitions=2) if kind == "mixed" else ""
    path = write_pipeline(tmp_path, pipeline(name, kind, bootstrap, source, topic, postgres, table, tmp_path / "ck"))

    condition = f"epoch=1,slot={PG_SLOT[kind]}" if point in AIMED else "epoch=1"
    crashed = eos_subprocess("run", str(path), "--failpoint", f"{point}=kill@{condition}")
    assert crashed.killed, f"the failpoint {point} did not fire:\n{crashed.output[-3000:]}"
    assert f"kill -9 at {point}" in crashed.output
    before_table = set(table_ids(postgres, table))
    before_topic = set(independent_committed_values(bootstrap, topic)) if topic else None
    with psycopg.connect(postgres) as conn:
        left = [x.gid for x in prepared_xacts(conn, name)]

    crash_s = time.monotonic() - started
    finished = eos_subprocess("run", str(path), "--finish-pending")
    restart_s = time.monotonic() - started - crash_s
    assert finished.returncode == 0, finished.output[-3000:]
    assert "was logged but not marked committed" in finished.output
    committed, rolled_back = resolved(finished.output)
    # What the crash left prepared, recovery resolved: decided ones committed, the others rolled back.
    assert committed + rolled_back == len(left), (left, finished.output[-3000:])
    if point == "sink.after_precommit":
        assert rolled_back >= 1 and committed == 0, left  # prepared, never decided
    elif point in ("sink.after_agreement", "sink.between_commits"):
        assert committed >= 1 and rolled_back == 0, left  # decided: resumed, not replayed
    else:
        assert committed == 0, left

    # Atomicity across systems, once the pending epoch is finished: the same records everywhere.
    in_table = table_ids(postgres, table)
    if topic:
        in_topic = independent_committed_values(bootstrap, topic)
        assert set(in_table) == set(in_topic), (
            f"table and topic differ: only in the table {sorted(set(in_table) - set(in_topic))[:5]}, only in the "
            f"topic {sorted(set(in_topic) - set(in_table))[:5]}"
        )
        assert Counter(in_topic) == Counter(sent)  # the independent consumer: exactly once
        topic_report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", topic)
        assert (topic_report["lost"], topic_report["duplicated"], topic_report["unexpected"]) == (0, 0, 0)
        assert topic_report["ok"] and topic_report["output_records"] == RECORDS, topic_report
        print(
            f"{kind} {point}: before the restart the table had {len(before_table)} ids, the topic {len(before_topic)}"
        )
    # Exactly once in the table: a plain query, and `eos verify`.
    assert Counter(in_table) == Counter(sent)
    report = eos_verify(
        "--bootstrap", bootstrap, "--input", source, "--output-table", table, "--dsn", postgres, "--output-id", "id"
    )
    assert report["ok"] and (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0), report
    assert report["output_records"] == report["input_records"] == RECORDS
    with psycopg.connect(postgres) as conn:
        assert prepared_xacts(conn, name) == []
    print(f"{kind} {point}: crashed run {crash_s:.0f} s, --finish-pending {restart_s:.0f} s; resolved {len(left)}")


@pytest.mark.slow
def test_negative_control_at_least_once_duplicates_are_caught(bootstrap, unique_name, postgres, input_topic, tmp_path):
    """The same crash without the protocol: slot 0 of epoch 1 committed its rows, then kill -9; the
    restart replays the whole epoch and writes them again. `eos verify` and the plain query must
    both see the duplicates: the checks above can fail."""
    source, sent = input_topic
    name = unique_name("p")
    table = name.replace("-", "_").lower()[:60]
    config = pipeline(name, "pg", bootstrap, source, "", postgres, table, tmp_path / "ck", mode="at-least-once")
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", "sink.between_commits=kill@epoch=1,slot=0")
    assert crashed.killed and "kill -9 at sink.between_commits" in crashed.output, crashed.output[-3000:]
    finished = eos_subprocess("run", str(path), "--finish-pending")
    assert finished.returncode == 0, finished.output[-3000:]
    seen = Counter(table_ids(postgres, table))
    duplicated = {value for value, n in seen.items() if n > 1}
    assert set(seen) == set(sent) and duplicated, "at-least-once never loses; this crash must duplicate"
    report = eos_verify(
        "--bootstrap", bootstrap, "--input", source, "--output-table", table, "--dsn", postgres, "--output-id", "id"
    )
    assert not report["ok"] and report["lost"] == 0 and report["duplicated"] == len(duplicated), report

"""Poison records on a real broker and real Spark: malformed records among good ones, under each
on_error policy, and under dlq with the driver killed at every failpoint of the epoch protocol.

Input: GOOD Avro records (keys g<i>) with BAD malformed ones (keys b<j>: truncated Avro, JSON
text, random bytes, an empty value, trailing garbage) interleaved, over 2 partitions. The sink
writes each good record as Avro, so the output is decoded with fastavro directly.
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import fastavro
import pytest

from eos.failpoints import POINTS, PROTOCOL_POINTS, release
from eos_connectors.kafka.clients import producer
from eos_ops.verify import Record, read_topic
from tests.pipelines import Finished, assert_exactly_once, eos_subprocess, run_in_process, write_pipeline
from tests.support import Later, wait_for

EVENT = {"type": "record", "name": "Event", "namespace": "eos.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}  # fmt: skip
OUT = {"type": "record", "name": "Out", "namespace": "eos.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}  # fmt: skip
GOOD = 300
BAD = 12


def avro_body(schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def good_value(i: int) -> bytes:
    return avro_body(EVENT, {"id": i, "name": f"n{i}", "at": 1_767_225_600_000 + i})


def bad_value(j: int) -> bytes:
    """Five kinds of poison, none of which decodes as exactly one Event."""
    kinds = [
        lambda: good_value(10_000 + j)[:-2],  # truncated
        lambda: json.dumps({"id": j, "name": "json"}).encode(),  # the wrong format
        lambda: random.Random(j).randbytes(3),  # garbage
        lambda: b"",  # empty
        lambda: good_value(10_000 + j) + b"\x00\x00",  # trailing bytes: another schema
    ]
    return kinds[j % len(kinds)]()


def produce_input(bootstrap: str, topic: str) -> dict[str, bytes]:
    """GOOD good records with BAD poison records spread among them; returns the bad ones by key."""
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    bad: dict[str, bytes] = {}
    every = GOOD // BAD
    for i in range(GOOD):
        out.produce(topic, good_value(i), f"g{i}".encode())
        if i % every == 3 and len(bad) < BAD:
            j = len(bad)
            bad[f"b{j}"] = bad_value(j)
            # One poison record carries a header of its own: the DLQ must keep it.
            headers = [("origin", b"test-producer")] if j == 0 else None
            out.produce(topic, bad[f"b{j}"], f"b{j}".encode(), headers=headers)
    assert out.flush(30) == 0
    assert len(bad) == BAD
    return bad


def pipeline(
    name: str,
    bootstrap: str,
    source: str,
    sink: str,
    folder: Path,
    on_error: str,
    dlq: str | None = None,
    trigger: str = "available-now",
):
    (folder / "event.avsc").write_text(json.dumps(EVENT))
    (folder / "out.avsc").write_text(json.dumps(OUT))
    src: dict[str, Any] = {
        "name": "events",
        "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 60},
        "key_format": "string",
        "value_format": {"type": "avro", "schema": "event.avsc"},
        "on_error": on_error,
    }
    if dlq:
        src["dlq_topic"] = dlq
    config = {
        "name": name,
        "checkpoint": str(folder / "ck"),
        "epochs": {"trigger": trigger, "slots": 2, "timeout": "60s"},
        "sources": [src],
        "sinks": [{
            "name": "out",
            "kafka": {"bootstrap": bootstrap, "topic": sink},
            "key": "_key",
            "value": "struct(id, name)",
            "value_format": {"type": "avro", "schema": "out.avsc"},
        }],
    }  # fmt: skip
    return write_pipeline(folder, config)


def output_ids(bootstrap: str, topic: str) -> Counter[int]:
    schema = fastavro.parse_schema(OUT)
    records = read_topic(bootstrap, topic, read_committed=True)
    return Counter(fastavro.schemaless_reader(io.BytesIO(r.value), schema)["id"] for r in records)


def input_locations(bootstrap: str, topic: str) -> dict[str, Record]:
    return {r.key.decode(): r for r in read_topic(bootstrap, topic, read_committed=True)}


def check_dlq(bootstrap: str, dlq: str, source: str, pipeline_name: str, bad: dict[str, bytes]) -> None:
    """Each bad record exactly once, raw key and value preserved, headers naming where it came from."""
    dead = read_topic(bootstrap, dlq, read_committed=True)
    assert_exactly_once(list(bad), Counter(r.key.decode() for r in dead))
    where = input_locations(bootstrap, source)
    for record in dead:
        key = record.key.decode()
        headers = dict(record.headers)
        assert record.value == bad[key] or (record.value is None and bad[key] == b""), key
        assert headers["eos.pipeline"] == pipeline_name.encode()
        assert headers["eos.source"] == b"events"
        assert headers["eos.topic"] == source.encode()
        assert int(headers["eos.partition"]) == where[key].partition
        assert int(headers["eos.offset"]) == where[key].offset
        assert headers["eos.error"].decode().startswith("value: not Avro of schema eos.test.Event: "), headers
    original = next(r for r in dead if r.key == b"b0")
    assert ("origin", b"test-producer") in original.headers


def test_fail_stops_with_topic_partition_offset_and_commits_nothing(bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    bad = produce_input(bootstrap, source)
    name = unique_name("p")
    finished = eos_subprocess("run", str(pipeline(name, bootstrap, source, sink, tmp_path, "fail")))
    assert finished.returncode != 0 and not finished.killed, finished.output[-3000:]
    where = input_locations(bootstrap, source)
    first_bad = [k for k in bad if f"{source}/{where[k].partition} offset {where[k].offset}:" in finished.output]
    assert first_bad, finished.output[-3000:]
    assert f"source events: cannot decode the record at {source}/" in finished.output
    assert "value: not Avro of schema eos.test.Event" in finished.output
    assert "use on_error: skip or dlq" in finished.output
    # eos's own message (Spark's log lines around it are Spark's business).
    [message] = [line for line in finished.output.splitlines() if line.startswith("error:")]
    assert message.startswith("error: epoch 0: source events: cannot decode"), message
    # The first epoch already holds a poison record: nothing may be committed.
    assert output_ids(bootstrap, sink) == Counter()
    assert not (tmp_path / "ck" / "commits" / "0").exists()
    ledger = [r for r in read_topic(bootstrap, f"eos-ledger-{name}", read_committed=True) if r.value]
    assert ledger == []


def test_after_a_fail_stop_switching_to_dlq_resumes_the_same_checkpoint(bootstrap, new_topic, unique_name, tmp_path):
    """The operator's way out of a poison stop: change on_error and restart. The epoch that failed
    is replayed with the same offsets; the poison records go to the DLQ, the rest to the output."""
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), unique_name("dlq")
    bad = produce_input(bootstrap, source)
    name = unique_name("p")
    stopped = eos_subprocess("run", str(pipeline(name, bootstrap, source, sink, tmp_path, "fail")))
    assert stopped.returncode != 0 and "cannot decode the record" in stopped.output, stopped.output[-3000:]
    assert (tmp_path / "ck" / "offsets" / "0").exists()  # epoch 0 was logged, not committed
    resumed = eos_subprocess("run", str(pipeline(name, bootstrap, source, sink, tmp_path, "dlq", dlq)))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "epoch 0 was logged but not marked committed" in resumed.output
    assert_exactly_once(list(range(GOOD)), output_ids(bootstrap, sink))
    check_dlq(bootstrap, dlq, source, name, bad)


def test_every_scan_ends_each_epoch_where_the_main_scan_does_so_a_switch_to_dlq_loses_nothing(
    bootstrap, new_topic, unique_name, tmp_path
):
    """Spark plans a source's main scan and its poison scan one after the other, and records keep
    arriving in between. Here they arrive while the first scan of epoch 0 is held right after it
    planned (a pause at source.plan): two good records and two poison ones, past its end. Had the
    poison scan planned on its own, it would have ended epoch 0 after them, passing them unread
    under `fail`; after the switch to `dlq` the main scan would then drop them from the output and
    no scan would ever send them to the dead-letter queue (eos.protocol.barrier)."""
    source, sink, dlq = new_topic(partitions=1), new_topic(partitions=1), unique_name("dlq")
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(40):
        out.produce(source, good_value(i), f"g{i}".encode())
    assert out.flush(30) == 0
    name = unique_name("p")
    failpoints = tmp_path / "ck" / "_eos" / "scratch" / "failpoints"
    stopped: list[Finished] = []
    path = pipeline(name, bootstrap, source, sink, tmp_path, "fail", trigger="0.5s")
    running = Later(
        0, lambda: stopped.append(eos_subprocess("run", str(path), "--failpoint", "source.plan=pause(120)"))
    )
    wait_for(lambda: failpoints.is_dir() and any(failpoints.glob("source_plan*")), 120, "epoch 0's first plan")
    bad = {"b0": bad_value(0), "b1": bad_value(1)}
    for key, value in [("g40", good_value(40)), ("b0", bad["b0"]), ("g41", good_value(41)), ("b1", bad["b1"])]:
        out.produce(source, value, key.encode(), headers=[("origin", b"test-producer")] if key == "b0" else None)
    assert out.flush(30) == 0
    release(failpoints)
    running.join()
    [finished] = stopped
    assert finished.returncode != 0 and "cannot decode the record" in finished.output, finished.output[-3000:]
    for logged in (tmp_path / "ck" / "offsets").iterdir():
        if logged.name.isdigit():
            main, poison = logged.read_text().splitlines()[2:]
            assert main == poison, (logged.name, main, poison)
    assert output_ids(bootstrap, sink) == Counter(range(40))  # epoch 0; epoch 1 stopped at b0

    resumed = eos_subprocess("run", str(pipeline(name, bootstrap, source, sink, tmp_path, "dlq", dlq)))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert_exactly_once(list(range(42)), output_ids(bootstrap, sink))
    check_dlq(bootstrap, dlq, source, name, bad)


def test_skip_outputs_exactly_the_good_records_and_counts_the_rest(
    spark, bootstrap, new_topic, unique_name, tmp_path, capsys
):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_input(bootstrap, source)
    counted: list[dict[str, int]] = []

    class Counting:
        def on_epoch_committed(self, report) -> None:
            counted.append(report.counted_only)

        def __getattr__(self, name: str):
            return lambda *args: None

    path = pipeline(unique_name("p"), bootstrap, source, sink, tmp_path, "skip")
    result = run_in_process(spark, path, progress=True, listeners=[Counting()])
    assert_exactly_once(list(range(GOOD)), output_ids(bootstrap, sink))
    assert sum(c.get("events.skipped", 0) for c in counted) == BAD
    assert result.records_out.get("out") == GOOD
    progress = capsys.readouterr().err
    shown = [int(line.split("poison skipped: ")[1].split()[0].rstrip(";")) for line in progress.splitlines()
             if "poison skipped: " in line]  # fmt: skip
    assert sum(shown) == BAD, progress


def test_dlq_gets_each_bad_record_once_with_provenance(spark, bootstrap, new_topic, unique_name, tmp_path):
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), unique_name("dlq")
    bad = produce_input(bootstrap, source)
    name = unique_name("p")
    result = run_in_process(spark, pipeline(name, bootstrap, source, sink, tmp_path, "dlq", dlq))
    assert result.epochs_committed >= 5
    assert_exactly_once(list(range(GOOD)), output_ids(bootstrap, sink))
    check_dlq(bootstrap, dlq, source, name, bad)
    # A second run over the same checkpoint adds nothing.
    run_in_process(spark, pipeline(name, bootstrap, source, sink, tmp_path, "dlq", dlq))
    assert_exactly_once(list(range(GOOD)), output_ids(bootstrap, sink))
    check_dlq(bootstrap, dlq, source, name, bad)


@pytest.mark.slow
@pytest.mark.parametrize("point", list(POINTS))
def test_dlq_exactly_once_across_a_kill_at_every_failpoint(point, bootstrap, new_topic, unique_name, tmp_path):
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), unique_name("dlq")
    bad = produce_input(bootstrap, source)
    name = unique_name("p")
    path = pipeline(name, bootstrap, source, sink, tmp_path, "dlq", dlq)

    # Epoch 1 holds good and poison records (60 records an epoch, a poison record every 25). The
    # source's points cannot know the epoch: they kill at the first plan or read (epoch 0).
    spec = f"{point}=kill" if point not in PROTOCOL_POINTS else f"{point}=kill@epoch=1"
    crashed = eos_subprocess("run", str(path), "--failpoint", spec)
    assert crashed.killed, crashed.output[-3000:]
    # The failpoint fired (its firing is recorded in the checkpoint: a task's own "kill -9 at"
    # line may die with the process before Spark forwards it).
    fired = [p.name for p in (tmp_path / "ck" / "_eos" / "scratch" / "failpoints").iterdir()]
    assert any(name.startswith(point.replace(".", "_") + "_kill") for name in fired), fired
    for _ in range(3):
        resumed = eos_subprocess("run", str(path))
        if resumed.returncode == 0:
            break
    assert resumed.returncode == 0, resumed.output[-3000:]

    assert_exactly_once(list(range(GOOD)), output_ids(bootstrap, sink))
    check_dlq(bootstrap, dlq, source, name, bad)

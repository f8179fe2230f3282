"""`eos verify PIPELINE.yaml` on real pipelines: a real broker, a real PostgreSQL, real Spark.

The first test is the pipeline a new user wrote from the docs (issue 36): JSON orders with one
poison record -> a SQL filter and aggregate -> a Kafka topic (update mode, keyed by country) and
a PostgreSQL upsert table, DLQ on. Run with `eos run --trigger available-now`, it must verify
EXACTLY ONCE (before, `eos verify` said FAILED: it counted the dead-lettered record as expected
output and read the update-mode changelog as duplicates); then each kind of tampering with its
output must make it say FAILED and name the problem. A stateless pipeline and a windowed one
(windows still open at the end, a record the watermark drops as late) must verify too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import TopicPartition
from psycopg import sql

from eos.cli import main as eos_main
from eos_connectors.kafka.clients import producer
from eos_ops.verify import read_topic
from eos_ops.verify_pipeline import verify_pipeline
from tests.pipelines import eos_subprocess, run_in_process, write_pipeline

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "country", "type": "string"},
    {"name": "amount", "type": "double"}, {"name": "status", "type": "string"}]}  # fmt: skip
COUNTRIES = ["DE", "FR", "NL"]


def produce(bootstrap: str, topic: str, values: list[bytes], keys: list[str] | None = None) -> None:
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, value in enumerate(values):
        out.produce(topic, value, (keys[i] if keys else f"k{i}").encode())
    assert out.flush(30) == 0


def orders() -> tuple[list[bytes], dict[str, tuple[float, int]]]:
    """40 orders (amounts with cents, so sums are floats), a poison record at the 18th place; and
    the expected totals per country of the paid ones."""
    values, totals = [], {}
    for i in range(40):
        country, paid = COUNTRIES[i % 3], i % 4 != 1
        order = {"order_id": f"o{i}", "country": country, "amount": round(10 + i * 1.37, 2),
                 "status": "paid" if paid else "cancelled"}  # fmt: skip
        values.append(json.dumps(order).encode())
        if paid:
            total, n = totals.get(country, (0.0, 0))
            totals[country] = (total + order["amount"], n + 1)
    values.insert(17, b'{"order_id": "o-poison", "country": "DE", "amount": ')  # truncated JSON
    return values, totals


def users_pipeline(name: str, bootstrap: str, source: str, sink: str, dlq: str, dsn: str, table: str, folder: Path):
    (folder / "order.avsc").write_text(json.dumps(ORDER))
    return write_pipeline(folder, {
        "name": name,
        "checkpoint": str(folder / "ck"),
        "epochs": {"output_mode": "update", "slots": 2, "timeout": "60s"},
        "sources": [{"name": "orders", "kafka": {"bootstrap": bootstrap, "topics": [source],
                                                 "max_records_per_epoch": 15},
                     "value_format": {"type": "json", "schema": "order.avsc"},
                     "on_error": "dlq", "dlq_topic": dlq}],
        "transforms": [{"name": "paid_by_country", "sql": "SELECT country, sum(amount) AS total, count(*) AS orders "
                                                         "FROM orders WHERE status = 'paid' GROUP BY country"}],
        "sinks": [
            {"name": "totals", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "country",
             "value_format": "json"},
            {"name": "totals_pg", "postgres": {"dsn": dsn, "table": table, "mode": "upsert", "key": ["country"],
                                               "create_table": True}},
        ],
    })  # fmt: skip


def by_name(report, name: str):
    return next(check for check in report.checks if check.name == name)


def produce_in_one_transaction(bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any]]]) -> None:
    out = producer({"bootstrap.servers": bootstrap, "transactional.id": f"tamper-{topic}-{time.time()}"})
    out.init_transactions(30)
    out.begin_transaction()
    for key, value in records:
        out.produce(topic, json.dumps(value).encode(), key.encode())
    out.commit_transaction(30)


def test_the_users_pipeline_verifies_exactly_once_and_tampering_is_named(
    spark, bootstrap, admin, new_topic, unique_name, postgres, tmp_path, capsys
):
    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), new_topic(prefix="dlq")
    values, totals = orders()
    produce(bootstrap, source, values)
    table = unique_name("t").replace("-", "_").lower()[:60]
    path = users_pipeline(unique_name("p"), bootstrap, source, sink, dlq, postgres, table, tmp_path)

    started = time.monotonic()
    ran = eos_subprocess("run", str(path), "--trigger", "available-now")
    assert ran.returncode == 0, ran.output[-3000:]
    changelog = read_topic(bootstrap, sink)
    assert len(changelog) > len(COUNTRIES), "one epoch only: the changelog must hold updates of the same keys"
    run_s = time.monotonic() - started

    started = time.monotonic()
    checked = eos_subprocess("verify", str(path))
    verify_s = time.monotonic() - started
    assert checked.returncode == 0, checked.output
    lines = checked.output.splitlines()
    assert lines[-1] == "result: EXACTLY ONCE", checked.output
    assert "41 records" in checked.output and "40 decoded, 1 poison (on_error: dlq)" in checked.output
    assert "a changelog, the last value per its key counts" in checked.output
    assert "upsert: the last value per key (country) counts" in checked.output
    assert f"dead letters of source orders -> Kafka topic {dlq}" in checked.output
    # Quiet: no Spark warning, no traceback. (The JVM's own banner about Spark's incubator module
    # comes from Spark's launcher, for every eos command that starts Spark.)
    noise = [line for line in lines if ("WARN" in line or "Traceback" in line) and "incubator modules" not in line]
    assert not noise, checked.output
    print(f"eos run {run_s:.1f} s, eos verify {verify_s:.1f} s:\n{checked.output}")

    # Tampering 1: the last total of FR written twice in one transaction -> a duplicate, only there.
    fr = {"country": "FR", "total": totals["FR"][0], "orders": totals["FR"][1]}
    produce_in_one_transaction(bootstrap, sink, [("FR", fr), ("FR", fr)])
    report = verify_pipeline(path, spark=spark)
    assert not report.ok
    topic_check = by_name(report, "sink totals")
    assert len(topic_check.duplicated) == 1 and "FR" in topic_check.duplicated[0], topic_check.duplicated
    assert not (topic_check.lost or topic_check.wrong or topic_check.unexpected)
    assert by_name(report, "sink totals_pg").ok and by_name(report, "dead letters of source orders").ok
    assert "result: FAILED (sink totals: 1 duplicated)" in list(report.lines())[-1]

    # Tampering 2: a wrong total of DE in the topic, a row changed in the table, the DLQ emptied.
    produce_in_one_transaction(bootstrap, sink, [("DE", {"country": "DE", "total": 1.5, "orders": 1})])
    with psycopg.connect(postgres) as conn:
        conn.execute(sql.SQL("UPDATE {} SET total = total + 0.01 WHERE country = 'NL'").format(sql.Identifier(table)))
    end = read_topic(bootstrap, dlq)[-1].offset + 1
    admin.delete_records([TopicPartition(dlq, 0, end)])[TopicPartition(dlq, 0, end)].result(30)
    report = verify_pipeline(path, spark=spark)
    text = "\n".join(report.lines())
    assert not report.ok
    assert [w[0] for w in by_name(report, "sink totals").wrong] == ["DE"], text
    table_check = by_name(report, "sink totals_pg")
    assert [w[0] for w in table_check.wrong] == [(("country", "NL"),)], text
    dead = by_name(report, "dead letters of source orders")
    assert len(dead.lost) == 1 and "malformed JSON" in dead.lost[0] and f"{source}/" in dead.lost[0], text
    assert "wrong (key, seen, expected), e.g.: [\"('DE'" in text and "lost, e.g.:" in text
    assert text.endswith(
        "result: FAILED (sink totals: 1 duplicated, 1 wrong; sink totals_pg: 1 wrong; dead letters of source orders: "
        "1 lost)"
    ), text

    # The command in this process: --json, exit 1 (and the test's Spark session is left running).
    capsys.readouterr()
    assert eos_main(["verify", "--json", str(path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["ok"] and [(c["name"], c["wrong"], c["lost"]) for c in data["checks"]] == [
        ("sink totals", 1, 0), ("sink totals_pg", 1, 0), ("dead letters of source orders", 0, 1)
    ]  # fmt: skip
    assert spark.range(1).count() == 1


def test_a_stateless_pipeline_verifies_exactly_once(spark, bootstrap, new_topic, unique_name, postgres, tmp_path):
    """A filter and projection in append mode, into a topic and an append table."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    values, _ = orders()
    produce(bootstrap, source, values[:17] + values[18:])  # no poison: on_error stays `fail`
    table = unique_name("t").replace("-", "_").lower()[:60]
    (tmp_path / "order.avsc").write_text(json.dumps(ORDER))
    path = write_pipeline(tmp_path, {
        "name": unique_name("p"), "checkpoint": str(tmp_path / "ck"),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s"},
        "sources": [{"name": "orders", "kafka": {"bootstrap": bootstrap, "topics": [source]},
                     "value_format": {"type": "json", "schema": "order.avsc"}}],
        "transforms": [{"name": "big", "sql": "SELECT order_id, upper(country) AS country, amount * 1.19 AS gross "
                                              "FROM orders WHERE amount > 20"}],
        "sinks": [{"name": "out", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "order_id"},
                  {"name": "out_pg", "postgres": {"dsn": postgres, "table": table, "create_table": True}}],
    })  # fmt: skip
    run_in_process(spark, path)
    started = time.monotonic()
    report = verify_pipeline(path, spark=spark)
    print(f"verify {time.monotonic() - started:.1f} s:\n" + "\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
    above = sum(1 for v in values if b"poison" not in v and json.loads(v)["amount"] > 20)
    assert [c.expected for c in report.checks] == [above, above] and above > 20
    assert [c.semantics for c in report.checks] == ["every row exactly once"] * 2

    # One output record again, outside any transaction: a duplicate.
    again = read_topic(bootstrap, sink)[0]
    produce(bootstrap, sink, [again.value], [again.key.decode()])
    report = verify_pipeline(path, spark=spark)
    out = by_name(report, "sink out")
    assert not report.ok and len(out.duplicated) == 1 and not (out.lost or out.unexpected or out.wrong)
    assert by_name(report, "sink out_pg").ok


TICK = {"type": "record", "name": "Tick", "fields": [
    {"name": "id", "type": "long"}, {"name": "grp", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}  # fmt: skip


def test_a_windowed_pipeline_open_windows_and_a_late_record(spark, bootstrap, new_topic, unique_name, tmp_path):
    """Append-mode windows of 10 s, watermark delay 10 s, epochs of 5 records. The record at 2 s
    comes in the fourth epoch: Spark drops late rows by the previous epoch's watermark (44 - 10 =
    34 s), which has closed its window. Streaming drops it, the batch query counts it. The
    window of 70-71 s is still open at the end (watermark 71 - 10 = 61 s)."""
    source, sink = new_topic(), new_topic()
    seconds = [0, 3, 6, 12, 15, 40, 41, 42, 43, 44, 45, 46, 50, 55, 56, 2, 70, 71]
    epoch = 1_767_225_600  # 2026-01-01
    ticks = [json.dumps({"id": i, "grp": "a", "ts": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(epoch + s))}Z"})
             for i, s in enumerate(seconds)]  # fmt: skip
    produce(bootstrap, source, [t.encode() for t in ticks])
    (tmp_path / "tick.avsc").write_text(json.dumps(TICK))
    path = write_pipeline(tmp_path, {
        "name": unique_name("w"), "checkpoint": str(tmp_path / "ck"),
        "epochs": {"trigger": "available-now", "slots": 1, "timeout": "60s"},
        "sources": [{"name": "ticks", "kafka": {"bootstrap": bootstrap, "topics": [source],
                                                "max_records_per_epoch": 5},
                     "value_format": {"type": "json", "schema": "tick.avsc"},
                     "watermark": {"column": "ts", "delay": "10s"}}],
        "transforms": [{"name": "counts", "sql": "SELECT grp, window(ts, '10 seconds') AS window, count(*) AS n "
                                                 "FROM ticks GROUP BY grp, window(ts, '10 seconds')"}],
        "sinks": [{"name": "out", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "grp"}],
    })  # fmt: skip
    run_in_process(spark, path)
    written = {
        json.loads(r.value)["window"]["start"][14:19]: json.loads(r.value)["n"] for r in read_topic(bootstrap, sink)
    }
    report = verify_pipeline(path, spark=spark)
    text = "\n".join(report.lines())
    print(text)
    out = by_name(report, "sink out")
    assert written["00:00"] == 3, written  # streaming dropped the late record
    assert report.ok, text
    assert len(out.late) == 2 and "n': 4" in text  # the batch's window of 4 and the 3 that was written
    assert len(out.open) == 1 and "still open (no watermark has closed them: not expected yet): 1, e.g.: " in text
    assert "'start': '2026-01-01T00:01:10.000Z'" in text  # 70-80 s
    assert out.expected == 4 and out.output_records == 4  # 0-10, 10-20, 40-50, 50-60 s
    assert "1 records had event times at or below the watermark their epoch dropped late rows by" in text

"""An exactly-once pipeline on the secured broker (SASL_SSL, SCRAM-SHA-512, ACLs enforced), through a
kill -9 of the driver mid-epoch and its recovery, then `eos status` and `eos reset` against it.

Three principals, each allowed every topic and group but only its own transactional ids: the
source's (which also writes the control log and the dead-letter queue) and one for each of two
Kafka sinks on the same cluster. A PostgreSQL sink takes the same epochs. The input holds one
poison record, which the dead-letter queue must hold exactly once. Passwords reach the pipeline
file through ${VAR}, never written in it. The output is read by a plain confluent-kafka consumer
(read_committed, with its own user) and a plain SQL query: no eos code checks eos.

The kill aims at the second Kafka sink's slot after its pre-commit, so its transaction is open
when the driver dies: `eos status` must see it through that sink's own credentials, and recovery
must fence it with them (the other sink's principal may not touch those ids).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import psycopg
from psycopg import sql

from eos.config import load_pipeline
from eos_connectors.kafka.clients import create_topic, producer
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.ledger import read_ledger
from eos_ops import kafka_security
from eos_ops.kafka_security import Acl
from eos_ops.status import gather, render, tools_classpath
from tests.integration.test_status import json_of
from tests.pipelines import eos_subprocess, run_in_process, write_pipeline
from tests.support import independent_committed_values
from tests.support_secure import SecureKafka

RECORDS = 900  # two epochs of at most 500: the crash hits epoch 1, the last one
POISON = b"{not json"
EVENT = {"type": "record", "name": "Event", "namespace": "eos.test", "fields": [{"name": "id", "type": "long"}]}
SLOTS = 2
# Sinks in plan order: outa (slots 0, 1), outb (2, 3), db (4, 5), the DLQ (6, 7).
OUTB_SLOT = 2


def _grant(secure_kafka: SecureKafka, user: str, transactional_prefix: str) -> list[Acl]:
    """Generous, except for transactional ids: only the principal's own prefix."""
    principal = f"User:{user}"
    acls = [
        Acl(principal, "TOPIC", "*", "ALL"),
        Acl(principal, "GROUP", "*", "ALL"),
        Acl(principal, "CLUSTER", "kafka-cluster", "ALL"),
        Acl(principal, "TRANSACTIONAL_ID", transactional_prefix, "ALL", pattern="PREFIXED"),
    ]
    kafka_security.create_acls(secure_kafka.admin, acls)
    return acls


def _client_config(settings: dict, variable: str) -> dict:
    """An entry's `config:` with the password left to the environment."""
    return {k: v for k, v in settings.items() if k != "bootstrap.servers"} | {"sasl.password": f"${{{variable}}}"}


def _produce_input(settings: dict, topic: str) -> list[str]:
    out = producer({**settings, "enable.idempotence": True, "linger.ms": 5})
    for i in range(RECORDS):
        out.produce(topic, json.dumps({"id": i}).encode(), f"k{i % 97}".encode())
        if i == RECORDS - 100:  # in epoch 1, where the crash happens
            out.produce(topic, POISON, b"poison")
    assert out.flush(30) == 0
    return [str(i) for i in range(RECORDS)]


def _table_ids(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table)))]


def test_a_secured_exactly_once_pipeline_survives_a_kill_9_and_status_and_reset_work(
    secure_kafka: SecureKafka, postgres: str, spark, unique_name, tmp_path: Path, monkeypatch
) -> None:
    started = time.monotonic()
    name = unique_name("sec")
    users = {role: unique_name(role) for role in ("src", "ka", "kb", "reader")}
    settings = {role: secure_kafka.settings(user) for role, user in users.items()}
    prefixes = {"src": f"eos/{name}/", "ka": f"{name}-a/", "kb": f"{name}-b/"}
    acls = [acl for role, prefix in prefixes.items() for acl in _grant(secure_kafka, users[role], prefix)]
    acls += secure_kafka.grant_all(users["reader"])
    env = {"SRC_PASSWORD": settings["src"]["sasl.password"], "KA_PASSWORD": settings["ka"]["sasl.password"],
           "KB_PASSWORD": settings["kb"]["sasl.password"]}  # fmt: skip
    try:
        source, out_a, out_b, dlq = (unique_name(t) for t in ("in", "outa", "outb", "dlq"))
        for topic, partitions in ((source, 2), (out_a, 2), (out_b, 2)):
            assert create_topic(secure_kafka.admin, topic, partitions)
        sent = _produce_input(settings["src"], source)
        table = name.replace("-", "_").lower()[:60]
        (tmp_path / "event.avsc").write_text(json.dumps(EVENT))
        kafka_sink = {"key": "_key", "value": "cast(id AS string)", "value_format": "string"}
        config = {
            "name": name,
            "checkpoint": str(tmp_path / "ck"),
            "epochs": {"trigger": "available-now", "slots": SLOTS, "timeout": "60s"},
            "sources": [{
                "name": "events",
                "kafka": {"bootstrap": secure_kafka.bootstrap, "topics": [source], "max_records_per_epoch": 500,
                          "config": _client_config(settings["src"], "SRC_PASSWORD")},
                "key_format": "string",
                "value_format": {"type": "json", "schema": "event.avsc"},
                "on_error": "dlq",
                "dlq_topic": dlq,
            }],
            "sinks": [
                {"name": "outa", **kafka_sink, "transactional_id_prefix": f"{name}-a",
                 "kafka": {"bootstrap": secure_kafka.bootstrap, "topic": out_a,
                           "config": _client_config(settings["ka"], "KA_PASSWORD")}},
                {"name": "outb", **kafka_sink, "transactional_id_prefix": f"{name}-b",
                 "kafka": {"bootstrap": secure_kafka.bootstrap, "topic": out_b,
                           "config": _client_config(settings["kb"], "KB_PASSWORD")}},
                {"name": "db", "input": "events", "postgres": {"dsn": postgres, "table": table, "create_table": True,
                                                               "columns": {"id": "cast(id AS string)"}}},
            ],
        }  # fmt: skip
        path = write_pipeline(tmp_path, config)
        assert not any(password in path.read_text() for password in env.values())

        # kill -9 of the driver once outb's first slot of epoch 1 has pre-committed.
        point = "sink.after_precommit"
        crashed = eos_subprocess("run", str(path), "--failpoint", f"{point}=kill@epoch=1,slot={OUTB_SLOT}", env=env)
        assert crashed.killed, f"the failpoint did not fire:\n{crashed.output[-3000:]}"
        assert f"kill -9 at {point}" in crashed.output
        crash_s = time.monotonic() - started

        # `eos status` sees the open transaction of outb, asked with outb's own credentials.
        report = gather(load_pipeline(path, env), path.parent)
        assert report["checkpoint"]["pending_replay"] == 1 and not report["running"]
        if tools_classpath() is not None:
            txns = report["transactions"]
            assert txns["available"], txns
            assert any(t["transactional_id"].startswith(f"{name}-b/outb/") for t in txns["open"]), txns

        # The restart recovers (fencing each pool with its own sink's credentials) and drains the input:
        # on the session's SparkSession (already up in a whole run), the passwords from the environment.
        for variable, password in env.items():
            monkeypatch.setenv(variable, password)
        finished = run_in_process(spark, path)
        assert finished.stopped_by == "finished" and finished.epochs_committed >= 1, finished
        restart_s = time.monotonic() - started - crash_s

        # Exactly once, read by readers that share no code with eos, as a user of their own.
        reader = settings["reader"]
        for topic in (out_a, out_b):
            assert Counter(independent_committed_values(secure_kafka.bootstrap, topic, settings=reader)) == Counter(
                sent
            ), topic
        assert Counter(_table_ids(postgres, table)) == Counter(sent)
        assert independent_committed_values(secure_kafka.bootstrap, dlq, settings=reader, raw=True) == [POISON]

        # `eos status`, the command, on the secured pipeline: caught up, nothing open, no password shown
        # (Kafka's TransactionsCommand was run through it above: gather is what the command prints).
        status = eos_subprocess("status", str(path), "--json", "--no-txns", env=env, timeout=180)
        assert status.returncode == 0, status.output[-3000:]
        data = json_of(status.output)
        assert data["checkpoint"]["pending_replay"] is None and data["lag"]["error"] is None
        assert sum(row["lag"] for row in data["lag"]["rows"]) == 0
        assert all(row["open"] == [] for row in data["lingering"]), data["lingering"]
        assert {row["sink"] for section in data["ledger"] for row in section["entries"]} >= {"outa", "outb"}
        assert "\n".join(render(data))
        for output in (crashed.output, status.output):
            assert not any(password in output for password in env.values())

        # `eos reset`: fences, forgets the ledger and the control log (tombstones: the topics stay,
        # a ledger topic may be shared), deletes the checkpoint.
        ledger = data["ledger"][0]["where"].removeprefix("Kafka topic ")
        reset = eos_subprocess("reset", str(path), "--yes", env=env, timeout=180)
        assert reset.returncode == 0, reset.output[-3000:]
        assert read_ledger(secure_kafka.admin_settings, ledger, name) == {}
        forgotten = KafkaControlLog(secure_kafka.admin_settings, f"{ledger}.control", name).state()
        assert (forgotten.previous, forgotten.decision, forgotten.pools) == (None, None, {})
        assert not (tmp_path / "ck").exists()
        print(
            f"secured pipeline: crashed run {crash_s:.0f} s, restart {restart_s:.0f} s, "
            f"whole test {time.monotonic() - started:.0f} s"
        )
    finally:
        kafka_security.delete_acls(secure_kafka.admin, acls)

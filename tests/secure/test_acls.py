"""Least privilege on the secured broker (SASL_SSL, SCRAM-SHA-512, no access without an ACL).

- Granted exactly what `eos acls --json` computes, a pipeline with a Kafka sink and a dead-letter
  queue (two principals) runs through a kill -9 and its recovery, exactly once; `eos status` and
  `eos reset` work with the same ACLs.
- Each ACL eos run needs, removed in turn, is named with its principal by the pre-flight check
  (eos_connectors.kafka.access) before anything is written, without Spark; and one real `eos run`
  missing one ACL stops with that message, exit 1, no traceback, nothing written.
- A cluster DescribeConfigs denied: the transaction-timeout check says so and carries on, or
  names both fixes when the brokers refuse the timeout.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from eos.api import PipelineInfo
from eos.cli import main
from eos.config import load_pipeline
from eos.errors import ConfigError
from eos.protocol.decision import DriverInfo
from eos_connectors.kafka import acls
from eos_connectors.kafka.access import AccessDenied, check_pipeline
from eos_connectors.kafka.clients import admin_client, consumer, create_topic, producer
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.ledger import read_ledger
from eos_connectors.kafka.sink import KafkaSink
from eos_connectors.kafka.source import KafkaSource
from eos_ops import kafka_security
from tests.pipelines import assert_exactly_once, eos_subprocess, run_in_process
from tests.support_secure import SecureKafka

EVENT = {"type": "record", "name": "Event", "namespace": "eos.test", "fields": [{"name": "id", "type": "long"}]}
GOOD, BAD = 150, 6  # two epochs of at most 80 offsets: the kill is in the second
RESOURCES = {"topic": "TOPIC", "group": "GROUP", "transactional-id": "TRANSACTIONAL_ID", "cluster": "CLUSTER"}


@dataclass
class Secured:
    """A pipeline on the secured broker: its file, its topics, and its two users."""

    path: Path
    name: str
    source: str
    sink: str
    dlq: str
    source_user: str
    sink_user: str

    @property
    def config(self) -> Any:
        return load_pipeline(self.path)

    @property
    def ledger(self) -> str:
        return f"eos-ledger-{self.name}"


def make_pipeline(secure: SecureKafka, folder: Path, unique_name, monkeypatch, users=None, source=None) -> Secured:
    """Source `events` (JSON, 2 partitions; poison goes to a dead-letter queue) read by one user,
    sink `out` (created by eos) written by another; passwords come from the environment."""
    name = unique_name("acl")
    source_user, sink_user = users or (unique_name("src"), unique_name("snk"))
    if source is None:
        source = unique_name("in")
        assert create_topic(secure.admin, source, 2)
    config: dict[str, Any] = {"sources": [], "sinks": []}
    for user in (source_user, sink_user):
        settings = dict(secure.settings(user))
        variable = "EOS_TEST_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", user).upper()
        monkeypatch.setenv(variable, settings.pop("sasl.password"))
        settings["sasl.password"] = f"${{{variable}}}"
        settings.pop("bootstrap.servers")
        config[user] = settings
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "event.avsc").write_text(json.dumps(EVENT))
    secured = Secured(folder / f"{name}.yaml", name, source, unique_name("out"), unique_name("dead"), source_user,
                      sink_user)  # fmt: skip
    pipeline = {
        "name": name,
        "checkpoint": str(folder / f"{name}-ck"),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s"},
        "sources": [{
            "name": "events",
            "kafka": {"bootstrap": secure.bootstrap, "topics": [source], "max_records_per_epoch": 80,
                      "config": config[source_user]},
            "key_format": "string",
            "value_format": {"type": "json", "schema": "event.avsc"},
            "on_error": "dlq",
            "dlq_topic": secured.dlq,
        }],
        "sinks": [{
            "name": "out",
            "kafka": {"bootstrap": secure.bootstrap, "topic": secured.sink, "create_topic": True,
                      "config": config[sink_user]},
            "key": "_key",
            "value": "cast(id as string)",
            "value_format": "string",
        }],
    }  # fmt: skip
    secured.path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    return secured


def computed(capsys, path: Path, commands: str = "run,status,reset") -> list[dict[str, Any]]:
    """`eos acls PATH --json` (in this process), parsed."""
    assert main(["acls", str(path), "--json", "--for", commands]) == 0
    return json.loads(capsys.readouterr().out)["acls"]


def as_acl(entry: dict[str, Any]) -> kafka_security.Acl:
    operation = re.sub(r"(?<!^)(?=[A-Z])", "_", entry["operation"]).upper()  # DescribeConfigs -> DESCRIBE_CONFIGS
    resource = RESOURCES[entry["resource_type"]]
    return kafka_security.Acl(entry["principal"], resource, entry["resource_name"], operation,
                              entry["pattern_type"].upper())  # fmt: skip


def key(entry: dict[str, Any]) -> tuple[str, str, str, str, str]:
    return (entry["principal"], entry["operation"], entry["resource_type"], entry["resource_name"],
            entry["pattern_type"])  # fmt: skip


def need_key(need: acls.Need) -> tuple[str, str, str, str, str]:
    return (need.acl.principal, need.acl.operation, need.acl.resource, need.acl.name, need.acl.pattern)


def produce_input(secure: SecureKafka, topic: str) -> tuple[list[str], list[str]]:
    """GOOD JSON events (keys g<i>) with BAD poison records (keys b<j>) among them, as the super user."""
    out = producer({**secure.admin_settings, "enable.idempotence": True, "linger.ms": 5})
    good, bad = [], []
    for i in range(GOOD):
        out.produce(topic, json.dumps({"id": i}).encode(), f"g{i}".encode())
        good.append(str(i))
        if i % (GOOD // BAD) == 7:
            bad.append(f"b{len(bad)}")
            out.produce(topic, b"{not json", bad[-1].encode())
    assert out.flush(30) == 0
    return good, bad


def committed(secure: SecureKafka, topic: str) -> list[Any]:
    """Every committed record of `topic`: an independent read_committed reader (the super user)."""
    from confluent_kafka import TopicPartition

    partitions = admin_client(secure.admin_settings).list_topics(topic, timeout=15).topics[topic].partitions
    reader = consumer({**secure.admin_settings, "isolation.level": "read_committed", "enable.partition.eof": True})
    records, ended = [], set()
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + 60
        while len(ended) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {set(partitions) - ended}"
            message = reader.poll(1)
            if message is None:
                continue
            if message.error():
                ended.add(message.partition())
                continue
            records.append(message)
    finally:
        reader.close()
    return records


def topics(secure: SecureKafka) -> set[str]:
    return set(admin_client(secure.admin_settings).list_topics(timeout=15).topics)


# ---------------------------------------------------------------------------------------------
# Test 1: exactly the computed ACLs, through a crash and its recovery, then status and reset
# ---------------------------------------------------------------------------------------------


def test_granted_exactly_the_computed_acls_a_pipeline_survives_kill_9_exactly_once(
    secure_kafka, spark, tmp_path, unique_name, monkeypatch, capsys
):
    secured = make_pipeline(secure_kafka, tmp_path, unique_name, monkeypatch)
    good, bad = produce_input(secure_kafka, secured.source)
    granted = [as_acl(e) for e in computed(capsys, secured.path)]
    assert {a.principal for a in granted} == {f"User:{secured.source_user}", f"User:{secured.sink_user}"}
    kafka_security.create_acls(secure_kafka.admin, granted)
    try:
        crashed = eos_subprocess("run", str(secured.path), "--failpoint", "sink.after_precommit=kill@epoch=1")
        assert crashed.killed, crashed.output[-3000:]
        checkpoint = secured.path.parent / f"{secured.name}-ck"
        assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
        # Recovery on the session's SparkSession (a second Spark start would only cost time).
        resumed = run_in_process(spark, secured.path)
        assert resumed.stopped_by == "finished" and resumed.epochs_committed == 1, resumed  # the replayed epoch 1

        assert_exactly_once(good, Counter(r.value().decode() for r in committed(secure_kafka, secured.sink)))
        assert_exactly_once(bad, Counter(r.key().decode() for r in committed(secure_kafka, secured.dlq)))

        # eos status reads everything it shows with the same ACLs (its transactions part runs Java's
        # TransactionsCommand, which has no truststore here: skipped).
        assert main(["status", str(secured.path), "--json", "--no-txns"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["control"]["exists"] and not status["running"], status["control"]
        # one section per client that reads the ledger: the sink's and the dead-letter queue's
        assert [s.get("error") for s in status["ledger"]] == [None, None], status["ledger"]
        assert all({e["sink"] for e in s["entries"]} == {"out", "events.dlq"} for s in status["ledger"])
        assert all("error" not in row for row in status["lingering"]), status["lingering"]
        assert status["lag"]["error"] is None and sum(r["lag"] for r in status["lag"]["rows"]) == 0

        assert main(["reset", str(secured.path), "--yes"]) == 0, capsys.readouterr().err
        # The topics stay (a ledger topic may be shared); the pipeline's records are tombstoned.
        admin_settings = secure_kafka.admin_settings
        assert read_ledger(admin_settings, secured.ledger, secured.name) == {}
        forgotten = KafkaControlLog(admin_settings, f"{secured.ledger}.control", secured.name).state()
        assert (forgotten.previous, forgotten.decision, forgotten.pools) == (None, None, {})
    finally:
        kafka_security.delete_acls(secure_kafka.admin, granted)


# ---------------------------------------------------------------------------------------------
# Test 2: every ACL eos run needs, removed in turn, is named before anything is written
# ---------------------------------------------------------------------------------------------


def test_each_acl_eos_run_needs_removed_is_named_before_anything_is_written(
    secure_kafka, tmp_path, unique_name, monkeypatch, capsys
):
    existing = make_pipeline(secure_kafka, tmp_path / "a", unique_name, monkeypatch)
    users = (existing.source_user, existing.sink_user)
    fresh = make_pipeline(secure_kafka, tmp_path / "b", unique_name, monkeypatch, users, existing.source)
    # `existing`: every topic eos would create exists (as after a first run); `fresh`: none does.
    for topic in (existing.sink, existing.dlq):
        assert create_topic(secure_kafka.admin, topic, 1)
    for topic in (existing.ledger, f"{existing.ledger}.control"):
        assert create_topic(secure_kafka.admin, topic, 1, config={"cleanup.policy": "compact"})
    entries = {which: computed(capsys, p.path, "run") for which, p in (("existing", existing), ("fresh", fresh))}
    granted = list(dict.fromkeys(as_acl(e) for group in entries.values() for e in group))  # shared: once
    kafka_security.create_acls(secure_kafka.admin, granted)
    try:
        for pipeline in (existing, fresh):
            found = check_pipeline(pipeline.config, pipeline.path.parent, probe_driver=True)
            assert not found.missing, [need_key(n) for n, _ in found.missing]
        # Only what a topic eos has yet to create holds is left for eos run to ask once it has.
        assert not check_pipeline(existing.config, probe_driver=True).deferred
        assert {n.acl.name for n in check_pipeline(fresh.config, probe_driver=True).deferred} == {
            fresh.sink,
            fresh.dlq,
            fresh.ledger,
            f"{fresh.ledger}.control",
        }

        checked: list[tuple[str, ...]] = []
        problems: list[str] = []
        for which, pipeline in (("existing", existing), ("fresh", fresh)):
            for entry in entries[which]:
                creates = entry["only_if"] is not None
                if entry["resource_type"] == "cluster" or creates != (which == "fresh"):
                    continue  # cluster DescribeConfigs: below; Create only while a topic does not exist
                acl = as_acl(entry)
                kafka_security.delete_acls(secure_kafka.admin, [acl])
                try:
                    started = time.monotonic()
                    found = check_pipeline(pipeline.config, pipeline.path.parent, probe_driver=True)
                    named = {need_key(n) for n, _ in found.missing}
                    if named != {key(entry)}:
                        problems.append(f"{which}: without {key(entry)} the check named {sorted(named)}")
                    elif any(n.optional != entry["optional"] for n, _ in found.missing):
                        problems.append(f"{which}: {key(entry)} is optional={entry['optional']}, the check said not")
                    checked.append((*key(entry), f"{time.monotonic() - started:.2f} s"))
                finally:
                    kafka_security.create_acls(secure_kafka.admin, [acl])
        assert not problems, "\n".join(problems)
        # The same, from the command line: `eos acls --check` (it does not fence the driver's id).
        assert main(["acls", str(existing.path), "--check"]) == 0, capsys.readouterr().err
        lag_group = kafka_security.Acl(f"User:{existing.source_user}", "GROUP", f"eos-{existing.name}.events", "READ")
        read = kafka_security.Acl(f"User:{existing.source_user}", "TOPIC", existing.source, "READ")
        kafka_security.delete_acls(secure_kafka.admin, [lag_group, read])
        try:
            assert main(["acls", str(existing.path), "--check"]) == 1
            said = capsys.readouterr().err
            assert f"{read.principal} may not Read on topic {existing.source}" in said
            assert f"--operation Read --group eos-{existing.name}.events" in said  # optional, but missing
        finally:
            kafka_security.create_acls(secure_kafka.admin, [lag_group, read])
        required = {key(e) for e in entries["existing"] if e["resource_type"] != "cluster" and not e["only_if"]}
        required |= {key(e) for e in entries["fresh"] if e["only_if"]}
        assert {c[:5] for c in checked} == required
        print(f"{len(checked)} ACLs removed in turn: " + ", ".join(f"{c[1]} {c[3]} {c[5]}" for c in checked))

        # A topic eos creates is asked about once eos created it, still before a record is written.
        created = fresh.config
        info = PipelineInfo(created.name, "t", True, 60.0, fresh.path.parent, fresh.ledger)
        sink = KafkaSink(created.sinks[0], info)
        sink_user, source_user = f"User:{fresh.sink_user}", f"User:{fresh.source_user}"
        for what, acl, step in [
            ("sink topic", kafka_security.Acl(sink_user, "TOPIC", fresh.sink, "WRITE"), lambda: sink.check(None)),
            ("ledger", kafka_security.Acl(sink_user, "TOPIC", fresh.ledger, "WRITE"),
             lambda: (sink.check(None), sink.set_up())),
            ("control topic", kafka_security.Acl(source_user, "TOPIC", f"{fresh.ledger}.control", "READ"),
             lambda: take_over(fresh, info)),
            ("driver id", kafka_security.Acl(source_user, "TRANSACTIONAL_ID", f"eos/{fresh.name}/~driver", "WRITE"),
             lambda: take_over(fresh, info)),
        ]:  # fmt: skip
            kafka_security.delete_acls(secure_kafka.admin, [acl])
            try:
                with pytest.raises(AccessDenied) as denied:
                    step()
                operation = acl.operation.capitalize()
                assert f"{acl.principal} may not {operation} on" in str(denied.value), what
                assert acl.name in str(denied.value) and "kafka-acls.sh" in str(denied.value), what
            finally:
                kafka_security.create_acls(secure_kafka.admin, [acl])
        for topic in (fresh.sink, fresh.ledger, f"{fresh.ledger}.control"):  # created, and empty
            assert not committed(secure_kafka, topic), topic
    finally:
        kafka_security.delete_acls(secure_kafka.admin, granted)


def take_over(secured: Secured, info: PipelineInfo) -> None:
    source = KafkaSource(secured.config.sources[0], info)
    control = source.control_log()
    try:
        control.take_over(DriverInfo("test", "host", 1, "127.0.0.1:1"))
    finally:
        control.close()


def test_eos_run_missing_an_acl_stops_before_writing_anything(secure_kafka, tmp_path, unique_name, monkeypatch, capsys):
    secured = make_pipeline(secure_kafka, tmp_path, unique_name, monkeypatch)
    produce_input(secure_kafka, secured.source)
    entries = computed(capsys, secured.path, "run")
    pool = (f"User:{secured.sink_user}", "Write", "transactional-id", f"eos/{secured.name}/out/", "prefixed")
    assert pool in {key(e) for e in entries}
    granted = [as_acl(e) for e in entries if key(e) != pool]
    kafka_security.create_acls(secure_kafka.admin, granted)
    try:
        started = time.monotonic()
        refused = eos_subprocess("run", str(secured.path))
        seconds = time.monotonic() - started
    finally:
        kafka_security.delete_acls(secure_kafka.admin, granted)
    assert refused.returncode == 1, refused.output[-3000:]
    assert "Traceback" not in refused.output, refused.output[-3000:]
    assert f"User:{secured.sink_user} may not Write on transactional-ids prefixed 'eos/{secured.name}/out/'" in (
        refused.output
    ), refused.output[-3000:]
    assert (
        f"--allow-principal User:{secured.sink_user} --operation Write --transactional-id eos/{secured.name}/out/ "
        "--resource-pattern-type prefixed" in refused.output
    )
    # Nothing written: no epoch in Spark's offset log, no output, no ledger entry, no dead letter.
    offsets = secured.path.parent / f"{secured.name}-ck" / "offsets"
    assert not offsets.exists() or not any(offsets.iterdir())
    present = topics(secure_kafka)
    assert secured.sink not in present  # its check failed before it would create it
    for topic in (secured.ledger, secured.dlq, f"{secured.ledger}.control"):
        assert topic not in present or not committed(secure_kafka, topic), topic
    print(f"eos run refused in {seconds:.1f} s")


# ---------------------------------------------------------------------------------------------
# The transaction-timeout check without cluster DescribeConfigs
# ---------------------------------------------------------------------------------------------


def test_the_transaction_timeout_check_without_cluster_describe_configs(
    secure_kafka, tmp_path, unique_name, monkeypatch, capsys
):
    secured = make_pipeline(secure_kafka, tmp_path, unique_name, monkeypatch)
    assert create_topic(secure_kafka.admin, secured.sink, 1)
    assert create_topic(secure_kafka.admin, secured.ledger, 1, config={"cleanup.policy": "compact"})
    entries = computed(capsys, secured.path, "run")
    describe_configs = next(
        as_acl(e) for e in entries
        if e["resource_type"] == "cluster" and e["principal"] == f"User:{secured.sink_user}"
    )  # fmt: skip
    assert describe_configs.operation == "DESCRIBE_CONFIGS"
    granted = [as_acl(e) for e in entries if as_acl(e) != describe_configs]
    kafka_security.create_acls(secure_kafka.admin, granted)
    config = secured.config
    info = PipelineInfo(config.name, "t", True, 60.0, secured.path.parent, secured.ledger)
    sink = config.sinks[0]
    longer = {**sink.kafka.config, "transaction.timeout.ms": 3_600_000}  # above the brokers' 15 min
    too_long = sink.model_copy(update={"kafka": sink.kafka.model_copy(update={"config": longer})})
    try:
        # Denied: said so, and the probe of the pool checks the timeout instead.
        KafkaSink(sink, info).check(None)
        said = capsys.readouterr().err
        assert f"User:{secured.sink_user} may not read the brokers' transaction.max.timeout.ms" in said
        assert "checked by a transactional-id probe instead" in said

        # A timeout the brokers refuse: both ways out named, no traceback.
        with pytest.raises(ConfigError) as refused:
            KafkaSink(too_long, info).check(None)
        assert "refuse transaction.timeout.ms=3600000" in str(refused.value)
        assert "set transaction.timeout.ms" in str(refused.value) and "raise transaction.max.timeout.ms" in str(
            refused.value
        )

        # Granted: the limit itself is read and named.
        kafka_security.create_acls(secure_kafka.admin, [describe_configs])
        with pytest.raises(ConfigError, match=r"allow at most transaction.max.timeout.ms=900000"):
            KafkaSink(too_long, info).check(None)
        kafka_security.delete_acls(secure_kafka.admin, [describe_configs])
    finally:
        kafka_security.delete_acls(secure_kafka.admin, granted)


def test_an_idempotent_producer_needs_write_on_its_topic_and_no_idempotent_write(secure_kafka, unique_name):
    """At-least-once sinks produce with an idempotent producer: Write on the topic is all `eos acls`
    lists for them (no IdempotentWrite on the cluster, KIP-679)."""
    topic = unique_name("idem")
    assert create_topic(secure_kafka.admin, topic, 1)
    user = unique_name("u")
    settings = secure_kafka.settings(user)
    write = kafka_security.Acl(f"User:{user}", "TOPIC", topic, "WRITE")
    kafka_security.create_acls(secure_kafka.admin, [write])
    try:
        delivered: list[Any] = []
        out = producer({**settings, "enable.idempotence": True})
        out.produce(topic, b"once", on_delivery=lambda error, _: delivered.append(error))
        assert out.flush(30) == 0 and delivered == [None], delivered
    finally:
        kafka_security.delete_acls(secure_kafka.admin, [write])
    assert [r.value() for r in committed(secure_kafka, topic)] == [b"once"]

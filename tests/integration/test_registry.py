"""The Schema Registry wire format against a real registry: Apicurio Registry (Confluent-compatible
API), fetched from Maven Central and run locally (tests/registry_support.py). Records written by
confluent-kafka's own AvroSerializer are read by eos, and eos's output is read back by
confluent-kafka's AvroDeserializer, so the wire format is checked against an independent
implementation, not against itself.

The registry is also reached the way a secured deployment reaches it: over HTTPS with a CA the
test made, with basic auth or a bearer token (through a proxy in front of Apicurio, which
authenticates only through an OIDC server). And a record whose schema id the registry
definitively does not know is routed as poison only once that answer is recorded in the
checkpoint, the same way in every replay (eos.protocol.poison)."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from eos.errors import PoisonDecision, PoisonRecord
from eos.protocol.checkpoint import Checkpoint
from eos_connectors.formats import avro
from eos_connectors.formats.config import FormatConfig
from eos_connectors.formats.registry import (
    Connection,
    HttpRegistry,
    RegistryUnavailable,
    UnknownSchemaId,
    UnknownSubject,
    connection,
    registry,
    wire_header,
)
from eos_ops.localkafka import free_port
from tests.pipelines import assert_exactly_once, committed_values, eos_subprocess, run_in_process, write_pipeline
from tests.registry_support import RunningRegistry, SecuredRegistry, make_ca, running_apicurio, secured
from tests.support import read_all

USER_V1 = {"type": "record", "name": "User", "namespace": "eos.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}  # fmt: skip
USER_V2 = {"type": "record", "name": "User", "namespace": "eos.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "tier", "type": "string", "default": "free"}]}  # fmt: skip
JSON_SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "T", "type": "object"}
PASSWORD, ROTATED, TOKEN = "canary-registry-pw-3d1f", "canary-registry-pw-rotated-5b90", "canary-registry-token-8e2a"


@pytest.fixture(scope="session")
def apicurio(tmp_path_factory: pytest.TempPathFactory):
    with running_apicurio(tmp_path_factory.mktemp("apicurio")) as running:
        yield running


@pytest.fixture(scope="session")
def secured_apicurio(apicurio: RunningRegistry, tmp_path_factory: pytest.TempPathFactory):
    with secured(apicurio.url, make_ca(tmp_path_factory.mktemp("registry-tls"))) as proxy:
        yield proxy


@pytest.fixture
def proxy(secured_apicurio: SecuredRegistry) -> SecuredRegistry:
    """The HTTPS registry with its first credentials, no outage, nothing counted yet."""
    secured_apicurio.users = {"eos": PASSWORD}
    secured_apicurio.tokens = {TOKEN}
    secured_apicurio.outage = 0
    secured_apicurio.answered.clear()
    secured_apicurio.asked.clear()
    return secured_apicurio


def signed_in(proxy: SecuredRegistry, password: str = PASSWORD) -> dict:
    """A `registry:` entry for the HTTPS registry with basic auth."""
    return {"url": proxy.url, "username": "eos", "password": password, "ca_file": str(proxy.tls.ca_file)}


def avro_body(schema: dict, record: dict) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def register_json_schema(where: Connection, subject: str) -> int:
    from confluent_kafka.schema_registry import Schema

    return HttpRegistry(where).client.register_schema(subject, Schema(json.dumps(JSON_SCHEMA), "JSON"))


def confluent_serializer(url: str, schema: dict):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema), conf={"auto.register.schemas": True})


def confluent_deserializer(url: str):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    return AvroDeserializer(SchemaRegistryClient({"url": url}))


def context(topic: str):
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE)


def test_client_register_lookup_and_unknown_ids(apicurio: RunningRegistry, unique_name):
    client = HttpRegistry(Connection(apicurio.url))
    subject = unique_name("users") + "-value"
    first = client.register(subject, USER_V1)
    assert client.register(subject, USER_V1) == first
    second = client.register(subject, USER_V2)
    assert second != first
    assert client.latest(subject) == (second, USER_V2)
    assert client.schema_by_id(first)["fields"] == USER_V1["fields"]
    with pytest.raises(UnknownSchemaId):
        client.schema_by_id(987_654)
    with pytest.raises(UnknownSubject):
        client.latest(unique_name("nobody"))
    # A 404 from a wrong path says nothing about the id: an outage, not a verdict on a record.
    wrong_path = HttpRegistry(Connection(apicurio.url.removesuffix("/apis/ccompat/v7") + "/no/such/api"))
    with pytest.raises(RegistryUnavailable, match="404"):
        wrong_path.schema_by_id(987_654)


def test_the_client_signs_in_over_verified_tls_and_never_quotes_a_secret(proxy: SecuredRegistry, unique_name):
    """Basic auth and a bearer token over HTTPS verified against the test's CA. A login refused,
    or a certificate no trusted CA signed, is an outage (retried), never an answer about an id,
    and no message or repr carries a password or token."""
    ca = str(proxy.tls.ca_file)
    basic = HttpRegistry(Connection(proxy.url, "eos", PASSWORD, ca_file=ca))
    subject = unique_name("users") + "-value"
    schema_id = basic.register(subject, USER_V1)
    assert basic.schema_by_id(schema_id)["fields"] == USER_V1["fields"]
    assert HttpRegistry(Connection(proxy.url, token=TOKEN, ca_file=ca)).latest(subject) == (schema_id, USER_V1)
    with pytest.raises(UnknownSchemaId):
        basic.schema_by_id(987_654)
    # Credentials written into the URL are moved into basic auth; the URL kept is without them.
    in_url = proxy.url.replace("https://", f"https://eos:{PASSWORD}@")
    where = connection(FormatConfig(type="avro", registry={"url": in_url, "ca_file": ca}).registry)
    assert where.location == proxy.url
    assert registry(where).schema_by_id(schema_id)["fields"] == USER_V1["fields"]
    assert PASSWORD not in repr(where) + repr(registry(where)) + repr(avro.decode_codec(
        FormatConfig(type="avro", registry={"url": in_url, "ca_file": ca}, subject=subject), "value", None
    ))  # fmt: skip
    refused = {
        "a wrong password": (Connection(proxy.url, "eos", "canary-wrong-pw", ca_file=ca), "401"),
        "a stale token": (Connection(proxy.url, token="canary-stale-token", ca_file=ca), "401"),
        "no credentials": (Connection(proxy.url, ca_file=ca), "401"),
        "no CA that signed the certificate": (Connection(proxy.url, "eos", PASSWORD), "CERTIFICATE_VERIFY_FAILED"),
    }
    for case, (where, expected) in refused.items():
        with pytest.raises(RegistryUnavailable) as raised:
            HttpRegistry(where).schema_by_id(schema_id)
        text = str(raised.value)
        assert expected in text, (case, text)
        assert not any(s in text for s in (PASSWORD, TOKEN, "canary-wrong-pw", "canary-stale-token")), (case, text)
    assert proxy.answered[401] >= 3


def test_a_read_task_routes_an_unknown_schema_id_only_once_it_is_recorded(
    bootstrap, new_topic, proxy: SecuredRegistry, unique_name
):
    """The read task on real broker messages and the real registry (over HTTPS, signed in): an
    id the registry definitively does not know, and one whose schema is JSON, stop the read under
    `fail` (naming the id and the way out); under `dlq` the read asks for them to be recorded,
    routing nothing; once recorded, their records are poison without asking the registry again.
    A registry outage is neither: the read fails, to be retried."""
    from eos_connectors.kafka.clients import producer
    from eos_connectors.kafka.range_reader import range_consumer, read_range
    from eos_connectors.kafka.reader import ReaderOptions, to_arrow

    topic = new_topic()
    where = connection(FormatConfig(type="avro", registry=signed_in(proxy)).registry)
    known = registry(where).register(f"{topic}-value", USER_V1)
    json_id = register_json_schema(where, unique_name("json") + "-value")
    body = avro_body(USER_V1, {"id": 1, "name": "ada"})
    values = [wire_header(known) + body, wire_header(987_654) + body, wire_header(json_id) + b'{"a": 1}']
    out = producer({"bootstrap.servers": bootstrap})
    for i, value in enumerate([*values, values[0]]):
        out.produce(topic, value, f"k{i}".encode())
    assert out.flush(30) == 0
    reader = range_consumer({"bootstrap.servers": bootstrap})
    try:
        messages = [m for batch in read_range(reader, topic, 0, 0, 4, stall_timeout_s=10) for m in batch]
    finally:
        reader.close()
    fmt = FormatConfig(type="avro", registry=signed_in(proxy), subject=f"{topic}-value")
    codec = avro.decode_codec(fmt, "value", None)

    def options(on_error: str) -> ReaderOptions:
        return ReaderOptions(
            name="users", client={"bootstrap.servers": bootstrap}, topics=[topic], starting={}, topic_ids={},
            parallelism=1, on_error=on_error, value_codec=codec,
        )  # fmt: skip

    with pytest.raises(PoisonRecord) as stop:
        to_arrow(options("fail"), messages, topic, 0)
    assert f"{topic}/0 offset 1" in stop.value.message and "schema id 987654" in stop.value.message
    assert "on_error: dlq" in (stop.value.hint or "")
    with pytest.raises(PoisonDecision) as asked:
        to_arrow(options("dlq"), messages, topic, 0)
    assert asked.value.source == "users"
    assert asked.value.decisions == [f"{proxy.url}#987654", f"{proxy.url}#{json_id}"]
    assert "JSON schema, not Avro" in asked.value.message
    lookups = sum(proxy.asked.values())
    rows = to_arrow(options("dlq"), messages, topic, 0, frozenset(asked.value.decisions)).to_pylist()
    assert [r["value"] for r in rows] == [{"id": 1, "name": "ada"}, None, None, {"id": 1, "name": "ada"}]
    assert [r["_eos_raw_value"] for r in rows] == [None, values[1], values[2], None]
    assert all("is recorded as poison for this pipeline" in r["_eos_error"] for r in rows[1:3])
    assert sum(proxy.asked.values()) == lookups  # the recorded answer is not asked again
    # An outage: the read fails, nothing is routed (an id this process has not looked up yet).
    newer = registry(where).register(unique_name("users") + "-value", USER_V2)
    late = messages[0]
    proxy.outage = 3  # the client's three tries of one lookup
    fresh = [_Message(wire_header(newer) + avro_body(USER_V2, {"id": 2, "name": "b", "tier": "t"}), late)]
    with pytest.raises(RegistryUnavailable, match="503"):
        to_arrow(options("dlq"), fresh, topic, 0)
    assert to_arrow(options("dlq"), fresh, topic, 0).to_pylist()[0]["_eos_error"] is None


class _Message:
    """A consumed message with another value (the reader reads only these methods)."""

    def __init__(self, value: bytes, like):
        self._value, self._like = value, like

    def value(self) -> bytes:
        return self._value

    def __getattr__(self, name: str):
        return getattr(self._like, name)


def test_reads_what_confluents_serializer_wrote_with_evolution_and_poison(spark, apicurio, unique_name):
    from pyspark.sql import functions as F

    topic = unique_name("users")
    old = confluent_serializer(apicurio.url, USER_V1)(({"id": 1, "name": "ada"}), context(topic))
    new = confluent_serializer(apicurio.url, USER_V2)(({"id": 2, "name": "bob", "tier": "pro"}), context(topic))
    assert old[0] == 0 and old[1:5] != new[1:5]  # two schema ids, in Confluent's wire format
    payloads = [old, new, b"\x07" + old[1:], old[:-2], old + b"\x00"]
    df = spark.createDataFrame(list(enumerate(payloads)), "i int, v binary")
    # No schema file: the reader schema is the subject's latest version (USER_V2).
    fmt = FormatConfig(type="avro", registry=apicurio.url, subject=f"{topic}-value")
    value, error = avro.decode_column(F.col("v"), fmt, "value", None)
    rows = df.select("i", value.alias("v"), error.alias("e")).orderBy("i").collect()
    assert rows[0]["v"].asDict() == {"id": 1, "name": "ada", "tier": "free"} and rows[0]["e"] is None
    assert rows[1]["v"].asDict() == {"id": 2, "name": "bob", "tier": "pro"} and rows[1]["e"] is None
    errors = [r["e"] for r in rows[2:]]
    assert all(r["v"] is None for r in rows[2:])
    assert "magic byte 0x07" in errors[0]  # poison is decided by the record's bytes alone
    assert "truncated" in errors[1]
    assert "1 bytes left over" in errors[2]
    # An id the registry does not know is not routed on the spot: the read fails, until the
    # source has the id recorded as poison (eos.protocol.poison; the pipeline tests below).
    unknown = spark.createDataFrame([(wire_header(987_654) + old[5:],)], "v binary")
    with pytest.raises(Exception, match=r"has no Avro schema for an id: schema id 987654"):
        unknown.select(avro.decode_column(F.col("v"), fmt, "value", None)[0]).collect()


def test_writes_what_confluents_deserializer_reads(spark, apicurio, unique_name, tmp_path):
    from pyspark.sql import functions as F

    topic = unique_name("out")
    (tmp_path / "user.avsc").write_text(json.dumps(USER_V2))
    fmt = FormatConfig(type="avro", schema=str(tmp_path / "user.avsc"), registry=apicurio.url)
    df = spark.createDataFrame([(5, "eve", "gold")], "id long, name string, tier string")
    [encoded] = [
        r[0] for r in df.select(avro.encode_column(F.struct("id", "name", "tier"), fmt, "value", None, topic)).collect()
    ]
    # Registered under the topic's subject (TopicNameStrategy) on the driver.
    schema_id, _ = HttpRegistry(Connection(apicurio.url)).latest(f"{topic}-value")
    assert encoded[:5] == wire_header(schema_id)
    assert confluent_deserializer(apicurio.url)(encoded, context(topic)) == {"id": 5, "name": "eve", "tier": "gold"}


def test_unreachable_registry_fails_the_task_instead_of_blaming_records(spark, tmp_path):
    from pyspark.sql import functions as F

    (tmp_path / "user.avsc").write_text(json.dumps(USER_V1))
    url = f"http://127.0.0.1:{free_port()}{'/apis/ccompat/v7'}"  # nothing listens there
    fmt = FormatConfig(type="avro", schema=str(tmp_path / "user.avsc"), registry=url)
    df = spark.createDataFrame([(wire_header(1) + b"\x02\x06ada",)], "v binary")
    value, error = avro.decode_column(F.col("v"), fmt, "value", None)
    with pytest.raises(Exception, match="unreachable"):
        df.select(value, error).collect()
    with pytest.raises(RegistryUnavailable):
        HttpRegistry(Connection(url)).schema_by_id(1)


def test_pipeline_through_the_registry_with_a_dead_letter_queue(
    spark, bootstrap, new_topic, unique_name, apicurio, tmp_path
):
    from eos_connectors.kafka.clients import producer

    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=1), unique_name("dlq")
    serialize = confluent_serializer(apicurio.url, USER_V1)
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    # Poison by its bytes: a body that is not the schema's, and no magic byte. And an id the
    # registry does not know: poison once recorded (before, it stopped the pipeline for good).
    known_id = HttpRegistry(Connection(apicurio.url)).register(f"{source}-value", USER_V1)
    bad = {
        "bad-0": wire_header(known_id) + b"\x02",
        "bad-1": b"plain text, no magic byte",
        "bad-2": wire_header(987_654) + avro_body(USER_V1, {"id": -1, "name": "nobody"}),
    }
    for i in range(120):
        out.produce(source, serialize({"id": i, "name": f"u{i}"}, context(source)), f"k{i}".encode())
        if i in (10, 70, 100):
            key = f"bad-{(10, 70, 100).index(i)}"
            out.produce(source, bad[key], key.encode())
    assert out.flush(30) == 0
    (tmp_path / "user_v2.avsc").write_text(json.dumps(USER_V2))
    name = unique_name("p")
    config = {
        "name": name,
        "checkpoint": str(tmp_path / "ck"),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s"},
        "sources": [{
            "name": "users",
            "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 50},
            "key_format": "string",
            "value_format": {"type": "avro", "registry": apicurio.url, "reader_schema": "user_v2.avsc"},
            "on_error": "dlq",
            "dlq_topic": dlq,
        }],
        "sinks": [{
            "name": "out",
            "kafka": {"bootstrap": bootstrap, "topic": sink},
            "key": "_key",
            "value": "struct(id, upper(name) AS name, tier)",
            "value_format": {"type": "avro", "schema": "user_v2.avsc", "registry": apicurio.url},
        }],
    }  # fmt: skip
    result = run_in_process(spark, write_pipeline(tmp_path, config))
    assert result.epochs_committed >= 3
    deserialize = confluent_deserializer(apicurio.url)
    values = [deserialize(m.value(), context(sink)) for m in read_all(bootstrap, sink)]
    assert Counter(v["id"] for v in values) == Counter(range(120))
    assert all(v["name"] == f"U{v['id']}" and v["tier"] == "free" for v in values)
    dead = read_all(bootstrap, dlq)
    assert sorted((m.key().decode(), m.value()) for m in dead) == sorted(
        (k.encode().decode(), v) for k, v in bad.items()
    )
    errors = {m.key().decode(): dict(m.headers())["eos.error"].decode() for m in dead}
    assert "not Avro of schema" in errors["bad-0"] and "magic byte 0x70" in errors["bad-1"]
    assert "schema id 987654 is recorded as poison" in errors["bad-2"]
    meta = Checkpoint(str(tmp_path / "ck")).read_meta()
    assert meta is not None and meta.poison == {"users": [f"{apicurio.url}#987654"]}


def test_unknown_ids_are_recorded_before_a_crash_and_a_rotated_password_is_no_config_change(
    bootstrap, new_topic, unique_name, proxy: SecuredRegistry, tmp_path
):
    """Through the HTTPS registry, signed in with a password, under `on_error: dlq`. The registry
    is down for the first lookups: the epoch is retried and nothing is routed. Epoch 0 holds a
    record whose schema id the registry does not know and one whose schema is JSON: their ids are
    recorded in the checkpoint before the attempt that routes them, and the driver is killed after
    that attempt's commit decision, before its commit. The password is then rotated (the old one
    is refused), and the restart with the new one is accepted, not refused as a config change
    (before, the password was part of the pinned config); the replay routes both records as
    recorded, without asking the registry again. Each reaches the dead-letter queue once, every
    other record the output once, and neither password is in the checkpoint or the output."""
    from eos_connectors.kafka.clients import producer

    source, sink, dlq = new_topic(partitions=2), new_topic(partitions=2), unique_name("dlq")
    where = connection(FormatConfig(type="avro", registry=signed_in(proxy)).registry)
    known = registry(where).register(f"{source}-value", USER_V1)
    json_id = register_json_schema(where, unique_name("json") + "-value")
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    bad = {
        "unknown-id": wire_header(987_654) + avro_body(USER_V1, {"id": -1, "name": "nobody"}),
        "json-schema": wire_header(json_id) + b'{"a": 1}',
    }
    for key, value in bad.items():  # first: in epoch 0
        out.produce(source, value, key.encode(), partition=0)
    sent = []
    for i in range(240):
        out.produce(source, wire_header(known) + avro_body(USER_V1, {"id": i, "name": f"u{i}"}), f"k{i}".encode(),
                    partition=i % 2)  # fmt: skip
        sent.append(f"u{i}")
    assert out.flush(30) == 0
    (tmp_path / "user.avsc").write_text(json.dumps(USER_V1))
    config = {
        "name": unique_name("p"),
        "checkpoint": str(tmp_path / "ck"),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s", "tolerable_failures": 4},
        "sources": [{
            "name": "users",
            "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 100},
            "key_format": "string",
            "value_format": {"type": "avro", "registry": signed_in(proxy, "${REGISTRY_PASSWORD}"),
                             "reader_schema": "user.avsc"},
            "on_error": "dlq",
            "dlq_topic": dlq,
        }],
        "sinks": [{"name": "out", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "_key", "value": "name",
                   "value_format": "string"}],
    }  # fmt: skip
    path = write_pipeline(tmp_path, config)
    proxy.outage = 6  # two lookups' three tries each
    crashed = eos_subprocess(
        "run", str(path), "--failpoint", "sink.after_agreement=kill@epoch=0", env={"REGISTRY_PASSWORD": PASSWORD}
    )
    assert crashed.killed, crashed.output[-3000:]
    assert proxy.answered[503] == 6 and proxy.outage == 0
    meta = Checkpoint(str(tmp_path / "ck")).read_meta()
    assert meta is not None and meta.poison == {"users": sorted([f"{proxy.url}#987654", f"{proxy.url}#{json_id}"])}

    proxy.users = {"eos": ROTATED}
    with pytest.raises(RegistryUnavailable, match="401"):
        HttpRegistry(Connection(proxy.url, "eos", PASSWORD, ca_file=str(proxy.tls.ca_file))).schema_by_id(known)
    proxy.asked.clear()
    finished = eos_subprocess("run", str(path), env={"REGISTRY_PASSWORD": ROTATED})
    assert finished.returncode == 0, finished.output[-3000:]
    looked_up = {path.split("/schemas/ids/")[1].split("?")[0] for path in proxy.asked if "/schemas/ids/" in path}
    assert looked_up == {str(known)}  # the recorded ids were not asked again
    assert_exactly_once(sent, committed_values(bootstrap, sink))
    dead = read_all(bootstrap, dlq)
    assert sorted((m.key().decode(), m.value()) for m in dead) == sorted(bad.items())
    assert all(b"is recorded as poison" in dict(m.headers())["eos.error"] for m in dead)
    stored = b"".join(f.read_bytes() for f in (tmp_path / "ck").rglob("*") if f.is_file())
    for secret in (PASSWORD, ROTATED):
        assert secret.encode() not in stored
        assert secret not in crashed.output + finished.output

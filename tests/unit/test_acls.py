"""`eos acls`: the ACLs a pipeline needs, computed from its file (pure logic: no Kafka)."""

from __future__ import annotations

import json
import textwrap

import pytest

from eos.cli import main
from eos.config import parse_pipeline
from eos_connectors.kafka import acls

ALICE = "{security.protocol: SASL_SSL, sasl.mechanism: SCRAM-SHA-512, sasl.username: alice, sasl.password: a}"
BOB = "{security.protocol: SASL_SSL, sasl.mechanism: PLAIN, sasl.username: bob, sasl.password: b}"


def pipeline(mode: str = "exactly-once", sink_extra: str = "", source_config: str = ALICE) -> str:
    return textwrap.dedent(f"""
        name: clicks
        checkpoint: /tmp/ck
        epochs: {{mode: {mode}}}
        sources:
          - name: events
            kafka: {{bootstrap: "b:9092", topics: [in], config: {source_config}}}
            value_format: string
            on_error: dlq
            dlq_topic: dead
        sinks:
          - name: out
            kafka: {{bootstrap: "b:9092", topic: out, create_topic: true, config: {BOB}}}
            value: value
            value_format: string
            {sink_extra}
        """)


def run_acls(config) -> set[tuple[str, str, str, str, str]]:
    """(principal, operation, resource, name, pattern) of every ACL eos run needs."""
    entries = acls.merge(acls.pipeline_needs(config), [acls.RUN])
    return {(e.acl.principal, e.acl.operation, e.acl.resource, e.acl.name, e.acl.pattern) for e in entries}


def test_exactly_once_needs_these_acls_per_principal_and_nothing_else():
    needed = run_acls(parse_pipeline(pipeline()))
    alice, bob = "User:alice", "User:bob"
    lit, pre = "literal", "prefixed"
    assert needed == {
        # the source and its group lookups
        (alice, "Read", "topic", "in", lit),
        (alice, "Describe", "group", "eos-unused", lit),
        (alice, "Read", "group", "eos-clicks.events", lit),  # lag monitors (optional)
        # its dead-letter queue: a Kafka sink with the source's client
        (alice, "Write", "topic", "dead", lit),
        (alice, "Create", "topic", "dead", lit),
        (alice, "Write", "transactional-id", "eos/clicks/events.dlq/", pre),
        (alice, "Write", "topic", "eos-ledger-clicks", lit),
        (alice, "DescribeConfigs", "topic", "eos-ledger-clicks", lit),
        (alice, "Create", "topic", "eos-ledger-clicks", lit),
        (alice, "DescribeConfigs", "cluster", "kafka-cluster", lit),  # optional
        # the control log, through the first source's client
        (alice, "Write", "transactional-id", "eos/clicks/~driver", lit),
        (alice, "Read", "topic", "eos-ledger-clicks.control", lit),
        (alice, "Write", "topic", "eos-ledger-clicks.control", lit),
        (alice, "DescribeConfigs", "topic", "eos-ledger-clicks.control", lit),
        (alice, "Create", "topic", "eos-ledger-clicks.control", lit),
        # the sink
        (bob, "Write", "topic", "out", lit),
        (bob, "Create", "topic", "out", lit),
        (bob, "Write", "transactional-id", "eos/clicks/out/", pre),
        (bob, "Write", "topic", "eos-ledger-clicks", lit),
        (bob, "DescribeConfigs", "topic", "eos-ledger-clicks", lit),
        (bob, "Create", "topic", "eos-ledger-clicks", lit),
        (bob, "DescribeConfigs", "cluster", "kafka-cluster", lit),  # optional
        # the first Kafka sink reads the cluster's ledger at recovery (each pool is fenced by its own sink)
        (bob, "Read", "topic", "eos-ledger-clicks", lit),
        (bob, "Describe", "group", "eos-unused", lit),
    }


def test_optional_and_conditional_entries_are_marked():
    entries = {(e.acl.principal, e.acl.operation, e.acl.resource, e.acl.name): e
               for e in acls.merge(acls.pipeline_needs(parse_pipeline(pipeline())))}  # fmt: skip
    assert entries[("User:alice", "Read", "group", "eos-clicks.events")].optional
    assert entries[("User:bob", "DescribeConfigs", "cluster", "kafka-cluster")].optional
    assert entries[("User:bob", "Create", "topic", "out")].only_if == "the topic does not exist yet"
    assert not entries[("User:bob", "Write", "topic", "out")].optional
    # Describe for status is implied by the Write run needs: one ACL, needed by both commands.
    assert entries[("User:bob", "Write", "topic", "out")].commands == ["run", "status"]
    assert ("User:bob", "Describe", "topic", "out") not in entries
    # reset deletes; status and run do not
    assert entries[("User:bob", "Delete", "topic", "eos-ledger-clicks")].commands == ["reset"]
    assert entries[("User:alice", "Delete", "topic", "eos-ledger-clicks.control")].commands == ["reset"]


def test_status_alone_needs_reads_and_describes_only():
    entries = acls.merge(acls.pipeline_needs(parse_pipeline(pipeline())), [acls.STATUS])
    assert {e.acl.operation for e in entries} <= {"Read", "Describe", "Write"}
    # Write only where status --fence fences (the first sink's pools), never on a topic
    assert all(e.acl.resource == "transactional-id" for e in entries if e.acl.operation == "Write")
    assert ("User:bob", "Read", "eos-ledger-clicks") in {
        (e.acl.principal, e.acl.operation, e.acl.name) for e in entries
    }


def test_at_least_once_needs_no_transactions_no_ledger_and_no_idempotent_write():
    needed = run_acls(parse_pipeline(pipeline(mode="at-least-once")))
    assert {(p, op, r, n) for p, op, r, n, _ in needed} == {
        ("User:alice", "Read", "topic", "in"),
        ("User:alice", "Describe", "group", "eos-unused"),
        ("User:alice", "Read", "group", "eos-clicks.events"),
        ("User:alice", "Write", "topic", "dead"),
        ("User:alice", "Create", "topic", "dead"),
        ("User:bob", "Write", "topic", "out"),
        ("User:bob", "Create", "topic", "out"),
    }


def test_a_sinks_transactional_id_prefix_is_its_pool_prefix():
    needed = run_acls(parse_pipeline(pipeline(sink_extra="transactional_id_prefix: team-a")))
    assert ("User:bob", "Write", "transactional-id", "team-a/out/", "prefixed") in needed
    assert not any(n == "eos/clicks/out/" for _, _, _, n, _ in needed)


@pytest.mark.parametrize(
    ("client", "principal"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "u"}, "User:u"),
        ({"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN", "sasl.username": "u"}, "User:u"),
        ({}, "User:ANONYMOUS"),
        ({"security.protocol": "SSL"}, "User:ANONYMOUS"),
    ],
)
def test_the_principal_of_a_client(client, principal):
    assert acls.principal_of(client) == principal


@pytest.mark.parametrize(
    ("client", "reason"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "u"}, "GSSAPI"),  # librdkafka's default mechanism
        ({"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"}, "certificate"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "without sasl.username"),
    ],
)
def test_a_principal_eos_cannot_know_is_asked_for(client, reason):
    with pytest.raises(acls.UnknownPrincipal, match=reason):
        acls.principal_of(client)


def test_given_principals_by_name_or_for_all():
    oauth = "{security.protocol: SASL_SSL, sasl.mechanism: OAUTHBEARER}"
    config = parse_pipeline(pipeline(source_config=oauth))
    with pytest.raises(acls.UnknownPrincipal, match=r"source events: .*--principal events=User:NAME"):
        acls.pipeline_needs(config)
    needed = run_acls_with(config, {"events": "User:svc-events"})
    assert ("User:svc-events", "Read", "topic", "in", "literal") in needed
    # the dead-letter queue and the control log share the source's client, hence its principal
    assert ("User:svc-events", "Write", "topic", "dead", "literal") in needed
    assert ("User:svc-events", "Write", "transactional-id", "eos/clicks/~driver", "literal") in needed
    assert {p for p, *_ in run_acls_with(config, {"*": "User:all"})} == {"User:all"}


def run_acls_with(config, principals):
    entries = acls.merge(acls.pipeline_needs(config, principals), [acls.RUN])
    return {(e.acl.principal, e.acl.operation, e.acl.resource, e.acl.name, e.acl.pattern) for e in entries}


def test_kafka_acls_lines():
    topic = acls.Acl("b:9092", "User:bob", "topic", "out", "literal", "Write")
    assert acls.kafka_acls_command(topic) == (
        "kafka-acls.sh --bootstrap-server b:9092 --command-config admin.properties --add --allow-principal "
        "User:bob --operation Write --topic out"
    )
    pool = acls.Acl("b:9092", "User:bob", "transactional-id", "eos/p/out/", "prefixed", "Write")
    assert acls.kafka_acls_command(pool, "a.properties").endswith(
        "--transactional-id eos/p/out/ --resource-pattern-type prefixed"
    )
    cluster = acls.Acl("b:9092", "User:bob", "cluster", "kafka-cluster", "literal", "DescribeConfigs")
    assert acls.kafka_acls_command(cluster).endswith("--operation DescribeConfigs --cluster")


def eos(capsys, *args: str) -> tuple[int, str, str]:
    """`eos ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_command_prints_commands_and_json(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(pipeline())
    _, text, _ = eos(capsys, "acls", str(path))
    lines = [line for line in text.splitlines() if line.startswith("kafka-acls.sh")]
    _, as_json, _ = eos(capsys, "acls", str(path), "--json")
    entries = json.loads(as_json)["acls"]
    assert len(lines) == len(entries) == len(acls.merge(acls.pipeline_needs(parse_pipeline(pipeline()))))
    assert "## User:bob at b:9092 (sink out" in text
    assert "password" not in text + as_json and "sasl" not in as_json
    _, run_only, _ = eos(capsys, "acls", str(path), "--json", "--for", "run")
    assert all("run" in e["commands"] for e in json.loads(run_only)["acls"])


def test_the_command_asks_for_a_principal_it_cannot_know(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(pipeline(source_config="{security.protocol: SASL_SSL, sasl.mechanism: OAUTHBEARER}"))
    code, _, err = eos(capsys, "acls", str(path))
    assert code == 2 and "--principal events=User:NAME" in err and "Traceback" not in err
    code, out, _ = eos(capsys, "acls", str(path), "--principal", "events=User:svc")
    assert code == 0 and "--allow-principal User:svc --operation Read --topic in" in out
    code, _, err = eos(capsys, "acls", str(path), "--principal", "nope=User:x")
    assert code == 2 and "no source or sink named 'nope'" in err

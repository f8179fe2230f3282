"""A real three-node Apache Kafka KRaft cluster under faults: kill -9 of a transaction coordinator,
SIGSTOP of a broker, loss of the active controller.

One cluster for every test under tests/cluster (tests/cluster/conftest.py), started once (a cold start
costs 15-30 s); the cluster tests run last, so it does not idle through the rest of the suite. Every
test starts from a whole cluster and leaves one behind: the `cluster` fixture resumes and restarts
whatever a test paused or killed and waits until every partition is back in sync.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec

from eos_connectors.kafka.clients import admin_client, consumer, create_topic, producer
from eos_ops.localkafka import (
    NODE_IDS,
    TOOL_JVM_OPTIONS,
    TRANSACTION_STATE,
    find_java,
    java_classpath,
    java_string_hash,
    transaction_partition,
)
from tests.support import wait_for, wait_for_topic

pytestmark = pytest.mark.slow

# The client-side request timeout of the paused-broker test: librdkafka's socket.timeout.ms (how long a
# request may wait for its answer) and request.timeout.ms (the produce ack timeout the broker applies).
CLIENT_REQUEST_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------------------
# Helpers: plain clients and Kafka's own tools, no eos code between the test and the cluster
# ---------------------------------------------------------------------------------------------


def transactional_producer(bootstrap: str, transactional_id: str, **config):
    """A transactional producer that retries a dead broker at least every second: librdkafka's reconnect
    back-off grows to reconnect.backoff.max.ms (10 s by default), which measured as up to 8 s of extra
    delay after the cluster had already moved the coordinator."""
    defaults = {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "reconnect.backoff.max.ms": 1000}
    return producer({**defaults, **config})


def commit_transaction(client, topic: str, values: list[str], partitions: int = 3) -> None:
    """One transaction over every partition of `topic`, committed. commit_transaction may be called again
    after a retriable error (librdkafka's documented contract); an abortable or fatal error fails."""
    client.begin_transaction()
    for i, value in enumerate(values):
        client.produce(topic, value=value.encode(), partition=i % partitions)
    deadline = time.monotonic() + 120
    while True:
        try:
            client.commit_transaction(max(1.0, deadline - time.monotonic()))
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or time.monotonic() >= deadline:
                raise


def values(bootstrap: str, topic: str, isolation: str) -> list[str]:
    """Every value of `topic` from the beginning to the end this isolation level sees (the last stable
    offset for read_committed, the high watermark for read_uncommitted)."""
    reader = consumer({
        "bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.partition.eof": True,
    })  # fmt: skip
    try:
        partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
        reader.assign([TopicPartition(topic, p, 0) for p in partitions])
        seen: list[str] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while at_end != set(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end of partition for {set(partitions) - at_end}"
            message = reader.poll(1.0)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            seen.append(message.value().decode())
        return sorted(seen)
    finally:
        reader.close()


def open_transactions(bootstrap: str, topic: str, partitions: int = 3) -> list[int] | None:
    """Partitions whose last stable offset is below the high watermark: a transaction is still open there.
    None if the offsets could not be listed (a partition without a leader during a failover). A new
    client each time, so no connection to a dead leader is reused."""
    admin = admin_client({"bootstrap.servers": bootstrap, "reconnect.backoff.max.ms": 1000})
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    try:
        stable = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=10)
        high = admin.list_offsets(request, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=10)
        offsets = {tp: (stable[tp].result().offset, high[tp].result().offset) for tp in request}
    except KafkaException:
        return None
    return [tp.partition for tp, (lso, hw) in offsets.items() if lso != hw]


def kafka_tool(main_class: str, *args: str) -> str:
    """Run one of Kafka's own command-line tools from the cached jars; its stdout."""
    command = [find_java(), *TOOL_JVM_OPTIONS, "-cp", java_classpath(), main_class, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command[-len(args) - 1 :])} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def table(text: str) -> list[dict[str, str]]:
    """TransactionsCommand's output: a header row, then whitespace-separated rows."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return [dict(zip(lines[0], row, strict=False)) for row in lines[1:]]


# ---------------------------------------------------------------------------------------------
# The coordinator formula (no cluster needed)
# ---------------------------------------------------------------------------------------------


def test_java_string_hash_matches_java():
    # Values of java.lang.String.hashCode(); "polygenelubricants" hashes to Integer.MIN_VALUE, which
    # Kafka's Utils.abs maps to 0; the emoji is a surrogate pair, hashed as two UTF-16 units.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("\N{GRINNING FACE}") == 0xD83D * 31 + 0xDE00
    assert transaction_partition("polygenelubricants", 6) == 0
    assert transaction_partition("hello", 6) == 99162322 % 6


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


def test_three_brokers_replication_factor_three_min_isr_two(cluster, admin, new_topic):
    metadata = admin.list_topics(timeout=10)
    assert sorted(metadata.brokers) == list(NODE_IDS)

    topic = new_topic(partitions=3)  # no replication factor given: the cluster's default
    partitions = wait_for_topic(admin, topic, 3)
    assert [len(p.replicas) for p in partitions.values()] == [3, 3, 3]
    assert all(set(p.isrs) == set(p.replicas) for p in partitions.values())

    transaction_state = admin.list_topics(TRANSACTION_STATE, timeout=10).topics[TRANSACTION_STATE].partitions
    assert transaction_state and all(len(p.replicas) == 3 for p in transaction_state.values())

    for name in (topic, TRANSACTION_STATE):
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        config = admin.describe_configs([resource])[resource].result(timeout=10)
        assert config["min.insync.replicas"].value == "2", name
    assert cluster.active_controller() in NODE_IDS


def test_kill_9_of_the_transaction_coordinator_aborts_the_open_transaction(cluster, bootstrap, new_topic):
    topic = new_topic(partitions=3)
    transactional_id = f"{topic}-txn"
    zombie = transactional_producer(bootstrap, transactional_id)
    zombie.init_transactions(60)
    zombie.begin_transaction()
    opened = [f"open-{i}" for i in range(30)]
    for i, value in enumerate(opened):
        zombie.produce(topic, value=value.encode(), partition=i % 3)
    assert zombie.flush(30) == 0, "the open transaction's records were not all written"
    assert open_transactions(bootstrap, topic) == [0, 1, 2]

    victim = cluster.transaction_coordinator(transactional_id)
    cluster.kill(victim)
    killed_at = time.monotonic()

    successor = transactional_producer(bootstrap, transactional_id)
    successor.init_transactions(90)  # finds the new coordinator, which aborts the open transaction
    print(f"init_transactions after kill -9 of node {victim}: {time.monotonic() - killed_at:.1f} s")
    coordinator = cluster.transaction_coordinator(transactional_id)
    assert coordinator in NODE_IDS and coordinator != victim

    # Kafka's own view of the transactional id agrees: the new coordinator, and no transaction open.
    described = table(
        kafka_tool(
            "org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", cluster.reachable_bootstrap(),
            "describe", "--transactional-id", transactional_id,
        )
    )  # fmt: skip
    assert [row["CoordinatorId"] for row in described] == [str(coordinator)], described
    assert described[0]["TransactionState"] in ("CompleteAbort", "Empty"), described

    # Aborted, not merely pending: the markers are written, so the stable offset reached the end.
    wait_for(lambda: open_transactions(cluster.reachable_bootstrap(), topic) == [], 30, "the abort markers")
    assert values(bootstrap, topic, "read_committed") == []
    assert values(bootstrap, topic, "read_uncommitted") == sorted(opened)

    # The zombie is fenced: its commit fails for good and its records stay invisible.
    with pytest.raises(KafkaException) as failed:
        zombie.commit_transaction(30)
    assert failed.value.args[0].fatal(), failed.value
    after = [f"after-{i}" for i in range(6)]
    commit_transaction(successor, topic, after)
    assert values(bootstrap, topic, "read_committed") == sorted(after)

    print(f"node {victim} restarted and in sync in {cluster.start_node(victim):.1f} s")


def test_pause_longer_than_the_request_timeout(cluster, bootstrap, new_topic):
    topic = new_topic(partitions=3)
    transactional_id = f"{topic}-txn"
    timeout_ms = int(CLIENT_REQUEST_TIMEOUT_S * 1000)
    client = transactional_producer(
        bootstrap, transactional_id, **{"socket.timeout.ms": timeout_ms, "request.timeout.ms": timeout_ms}
    )
    client.init_transactions(60)
    frozen = cluster.transaction_coordinator(transactional_id)

    cluster.pause(frozen)
    paused_at = time.monotonic()
    try:
        during = [f"during-{i}" for i in range(9)]
        commit_transaction(client, topic, during)
        committed_after = time.monotonic() - paused_at
        assert cluster.node(frozen).state() == "paused", "the transaction must run while the node is frozen"
        assert frozen not in cluster.brokers(), "the frozen broker should have been fenced"
        assert cluster.transaction_coordinator(transactional_id) != frozen
        time.sleep(max(0.0, 1.5 * CLIENT_REQUEST_TIMEOUT_S - (time.monotonic() - paused_at)))
    finally:
        cluster.resume(frozen)
    paused_for = time.monotonic() - paused_at
    print(f"node {frozen} paused {paused_for:.1f} s; the transaction committed {committed_after:.1f} s in")
    assert paused_for > CLIENT_REQUEST_TIMEOUT_S

    after = [f"after-{i}" for i in range(9)]
    commit_transaction(client, topic, after)
    cluster.wait_until_healthy(timeout=120)
    assert frozen in cluster.brokers()
    assert values(bootstrap, topic, "read_committed") == sorted(during + after)


def test_controller_failover(cluster, bootstrap, unique_name):
    old = cluster.active_controller()
    assert old in NODE_IDS
    cluster.kill(old)
    killed_at = time.monotonic()
    new = wait_for(lambda: (c := cluster.active_controller(timeout=0)) not in (None, old) and c, 30, "a new leader")
    print(f"controller {old} killed; {new} elected in {time.monotonic() - killed_at:.1f} s")

    # Kafka's own tool sees the same leader (and answers at all: the quorum has a majority).
    status = kafka_tool(
        "org.apache.kafka.tools.MetadataQuorumCommand",
        "--bootstrap-controller", cluster.reachable_bootstrap(controllers=True), "describe", "--status",
    )  # fmt: skip
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["LeaderId"].strip() == str(new), status

    # Topics can be created once the dead broker is fenced; two brokers are left, so two replicas. A new
    # admin client: librdkafka sends CreateTopics to the broker the metadata named controller, and one
    # made before the kill may still name the dead node (measured: "Timed out waiting for controller").
    wait_for(lambda: cluster.brokers() == set(NODE_IDS) - {old}, 30, f"broker {old} to be fenced")
    admin = admin_client({"bootstrap.servers": cluster.reachable_bootstrap()})
    topic = unique_name("t")
    assert create_topic(admin, topic, 3, replication=2)
    partitions = wait_for_topic(admin, topic, 3)
    assert all(old not in p.replicas and len(p.replicas) == 2 for p in partitions.values())

    client = transactional_producer(bootstrap, f"{topic}-txn")
    client.init_transactions(60)
    committed = [f"v-{i}" for i in range(6)]
    commit_transaction(client, topic, committed)
    assert values(bootstrap, topic, "read_committed") == sorted(committed)

    print(f"node {old} restarted and in sync in {cluster.start_node(old):.1f} s")
    assert cluster.active_controller() in NODE_IDS

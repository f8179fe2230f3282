"""One place to build Kafka clients (confluent-kafka / librdkafka) with eos's defaults, and to ask
a cluster about itself (topics with their ids, the cluster id, broker settings).

- librdkafka logs go to the Python logger "eos.kafka" instead of raw stderr lines.
- Errors are classified for retries: retriable, transaction-abortable, fatal, or *indefinite*
  (a timeout: the request may still land later, see eos_connectors.kafka.sink).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("eos.kafka")
# Silent unless the application configures logging (the eos CLI does, with -v for details):
# librdkafka warns about expected things, e.g. "coordinator load in progress" at start-up.
log.addHandler(logging.NullHandler())

ClientConfig = Mapping[str, Any]


# librdkafka backs off up to 10 s before reconnecting to a broker it lost; on a cluster that
# fails over in seconds that doubles recovery (measured on the 3-broker test cluster: 15.5 s
# against ~7 s for a new transactional producer after its coordinator was killed).
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.max.ms": 1000}


# Which settings a client takes from a pipeline entry's `config:`: all of them, except those that
# belong to the other client type. Every client eos builds from an entry (the sinks' producers and the
# source's consumers, but also the control log's and the dead-letter queue's producers on a source's
# cluster, recovery's fencing, the ledger's readers, lag and progress for monitors, `eos status` and
# `eos reset`) goes through admin_client / producer / consumer below, which apply this rule: so each
# one carries the entry's security settings (`security.protocol`, `ssl.*` including
# `enable.ssl.certificate.verification`, `sasl.*` including `sasl.oauthbearer.*`), its `client.id`,
# timeouts and everything else librdkafka applies to any client. Not a list of "connection settings"
# that a new security setting could fall out of: the exceptions are the closed lists of librdkafka's
# consumer-only and producer-only properties (scope C and P in librdkafka's CONFIGURATION.md, v2.15,
# and confluent-kafka's Python names for their callbacks, on_commit and on_delivery).
# librdkafka ignores them on the other client type with a warning, and some would change what eos
# relies on if they were applied there (a source's `isolation.level` on the ledger's reader is
# overridden anyway; a sink's `transactional.id` or `acks` must never reach an admin client).
CONSUMER_ONLY = frozenset({
    "auto.commit.enable", "auto.commit.interval.ms", "auto.offset.reset", "check.crcs", "consume.callback.max.messages",
    "consume_cb", "coordinator.query.interval.ms", "enable.auto.commit", "enable.auto.offset.store",
    "enable.partition.eof", "fetch.error.backoff.ms", "fetch.max.bytes", "fetch.message.max.bytes", "fetch.min.bytes",
    "fetch.queue.backoff.ms", "fetch.wait.max.ms", "group.id", "group.instance.id", "group.protocol",
    "group.protocol.type", "group.remote.assignor", "heartbeat.interval.ms", "isolation.level",
    "max.partition.fetch.bytes", "max.poll.interval.ms", "max.poll.records", "offset.store.method",
    "offset.store.path", "offset.store.sync.interval.ms", "offset_commit_cb", "on_commit",
    "partition.assignment.strategy", "queued.max.messages.kbytes", "queued.min.messages", "rebalance_cb",
    "session.timeout.ms", "share.acknowledgement.mode",
})  # fmt: skip
PRODUCER_ONLY = frozenset({
    "acks", "batch.num.messages", "batch.size", "compression.codec", "compression.level", "compression.type",
    "delivery.report.only.error", "delivery.timeout.ms", "dr_cb", "dr_msg_cb", "enable.gapless.guarantee",
    "enable.idempotence", "linger.ms", "message.send.max.retries", "message.timeout.ms", "msg_order_cmp",
    "on_delivery", "partitioner", "partitioner_cb", "produce.offset.report", "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes", "queue.buffering.max.messages", "queue.buffering.max.ms", "queuing.strategy",
    "request.required.acks", "request.timeout.ms", "retries", "sticky.partitioning.linger.ms",
    "transaction.timeout.ms", "transactional.id",
})  # fmt: skip
_NOT_FOR = {"admin": CONSUMER_ONLY | PRODUCER_ONLY, "producer": CONSUMER_ONLY, "consumer": PRODUCER_ONLY}


def settings_for(role: str, config: ClientConfig) -> dict[str, Any]:
    """The settings of `config` (an entry's client settings) that a client of `role` ("admin",
    "producer", "consumer") takes: every one except those of the other client type."""
    dropped = _NOT_FOR[role]
    return {key: value for key, value in config.items() if key not in dropped}


def principal(config: ClientConfig) -> str:
    """Who a client authenticates as, for messages (never a secret): the SASL user, the mechanism,
    the client certificate, or no one."""
    protocol = str(config.get("security.protocol", "plaintext")).upper()
    mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI").upper()
    if protocol.startswith("SASL"):
        user = config.get("sasl.username")
        if user:
            return f"User:{user} ({mechanism})"
        return f"the {mechanism} principal" + (f" of client {config['client.id']}" if "client.id" in config else "")
    if protocol == "SSL" and (config.get("ssl.certificate.location") or config.get("ssl.certificate.pem")):
        return f"the TLS client certificate {config.get('ssl.certificate.location', '(inline PEM)')}"
    return f"ANONYMOUS ({protocol}, no SASL user)"


def _with_defaults(role: str, config: ClientConfig, **defaults: Any) -> dict[str, Any]:
    merged = {**CLIENT_DEFAULTS, **defaults, **settings_for(role, config)}
    merged.setdefault("logger", log)
    return merged


class _ClientErrors:
    """An admin client's error callback: remembers a refused authentication. librdkafka reports a
    wrong password, a mechanism the broker does not enable or a certificate it rejects only there
    (the request itself just times out, as if the broker were down)."""

    def __init__(self, caller: Any = None) -> None:
        self.authentication: str | None = None
        self.caller = caller  # the caller's own error_cb, which still gets every error

    def __call__(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL):
            self.authentication = error.str()
        if self.caller is not None:
            self.caller(error)


def admin_client(config: ClientConfig):
    from confluent_kafka.admin import AdminClient

    settings = _with_defaults("admin", config)
    errors = _ClientErrors(settings.get("error_cb"))
    client = AdminClient({**settings, "error_cb": errors})
    client.eos_errors = errors  # read by `refused_authentication`
    return client


def refused_authentication(admin: Any) -> str | None:
    """Why the cluster refused this admin client's credentials, if it did (after a request failed)."""
    errors = getattr(admin, "eos_errors", None)
    if errors is None:
        return None
    admin.poll(0.1)  # callbacks are served by poll()
    return errors.authentication


def producer(config: ClientConfig, **defaults: Any):
    from confluent_kafka import Producer

    return Producer(producer_config(config, **defaults))


def producer_config(config: ClientConfig, **defaults: Any) -> dict[str, Any]:
    # murmur2 keeps key -> partition identical to the Java clients (librdkafka's default is crc32).
    merged = _with_defaults("producer", config, partitioner="murmur2_random", **defaults)
    if "transactional.id" in merged:
        # With sparse connections (librdkafka's default) the transaction coordinator's broker is
        # connected only once init_transactions asks for it, and the PID request, finding it not
        # up yet, often waits for librdkafka's 500 ms retry timer: init_transactions took 60 ms,
        # one call in ~8 took 510 ms, against 5-15 ms with every broker connected at creation
        # (measured on the local broker). Sinks, the control log and recovery's fencing all
        # create transactional producers on their critical path.
        merged.setdefault("enable.sparse.connections", False)
    return merged


def connect(instance: Any, topic: str, timeout_s: float) -> None:
    """Have a new producer connected to a broker it learned before it asks for a producer id.

    librdkafka answers the first metadata request over its bootstrap connection, then closes that
    connection and connects to the broker the answer named. A producer-id request (an idempotent
    producer's first one, or init_transactions) made in that gap finds no broker up and waits for
    librdkafka's 500 ms retry timer (src/rdkafka_txnmgr.c, rd_kafka_txn_coord_query). The second
    request is answered once a learned broker is up. Timed in the slots of bench-sized
    exactly-once runs: with one request 11 of 40 fresh producers took 505-508 ms, with two none of
    20 took over 0.1 s (on an idle broker every variant takes ~10 ms: the gap needs a busy machine)."""
    instance.list_topics(topic, timeout=timeout_s)
    instance.list_topics(topic, timeout=timeout_s)


def consumer(config: ClientConfig, **defaults: Any):
    from confluent_kafka import Consumer

    base = {"group.id": "eos-unused", "enable.auto.commit": False, "enable.auto.offset.store": False}
    return Consumer(_with_defaults("consumer", config, **{**base, **defaults}))


# ---------------------------------------------------------------------------------------------
# Topics
# ---------------------------------------------------------------------------------------------


def describe_partitions(admin, topics: Iterable[str], timeout: float = 10.0) -> dict[str, list[int]]:
    """Partition ids of each topic; raises UnknownTopic for a topic that does not exist."""
    from confluent_kafka import KafkaException

    result: dict[str, list[int]] = {}
    for topic in topics:
        try:
            metadata = admin.list_topics(topic=topic, timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnreachable(str(exc)) from exc
        if not metadata.brokers:
            raise BrokerUnreachable("no broker answered the metadata request")
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise UnknownTopic(topic)
        result[topic] = sorted(info.partitions)
    return result


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: str  # Kafka's topic id: a topic deleted and recreated under the same name gets a new one
    partitions: list[int]
    replication: int


def describe_topics(admin, topics: Iterable[str], timeout: float = 10.0) -> dict[str, TopicInfo]:
    """Partitions and ids of topics (one request); raises UnknownTopic, BrokerUnreachable."""
    from confluent_kafka import KafkaException, TopicCollection

    names = list(topics)
    if not names:
        return {}
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout)
    found: dict[str, TopicInfo] = {}
    for name, future in futures.items():
        try:
            description = future.result()
        except KafkaException as exc:
            if _names_unknown_topic(exc):
                raise UnknownTopic(name) from None
            if is_refused(exc):
                raise NotAuthorized(str(exc)) from None
            refused = refused_authentication(admin)
            if refused:
                raise NotAuthenticated(refused) from None
            raise BrokerUnreachable(str(exc)) from exc
        partitions = sorted(p.id for p in description.partitions)
        if not partitions:
            raise UnknownTopic(name)
        replication = min(len(p.replicas) for p in description.partitions)
        found[name] = TopicInfo(name, str(description.topic_id), partitions, replication)
    return found


def cluster_id(admin, timeout: float = 10.0) -> str:
    """The cluster's id (what groups sinks: two bootstrap lists can name one cluster)."""
    from confluent_kafka import KafkaException

    try:
        return str(admin.describe_cluster(request_timeout=timeout).result().cluster_id)
    except KafkaException as exc:
        raise BrokerUnreachable(str(exc)) from exc


def broker_count(admin, timeout: float = 10.0) -> int:
    from confluent_kafka import KafkaException

    try:
        return len(admin.describe_cluster(request_timeout=timeout).result().nodes)
    except KafkaException as exc:
        raise BrokerUnreachable(str(exc)) from exc


def broker_setting(admin, key: str, timeout: float = 10.0) -> str | None:
    """A broker's value of `key` (asked of one broker: cluster-wide settings agree)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    node = admin.describe_cluster(request_timeout=timeout).result().nodes[0]
    resource = ConfigResource(ResourceType.BROKER, str(node.id))
    configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    entry = configs.get(key)
    return entry.value if entry is not None else None


def topic_settings(admin, topic: str, timeout: float = 10.0) -> dict[str, str]:
    """The topic's configuration; raises UnknownTopic for a topic the broker asked does not know."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    except KafkaException as exc:
        if _names_unknown_topic(exc):
            raise UnknownTopic(topic) from None
        raise
    return {key: entry.value for key, entry in configs.items()}


def _names_unknown_topic(exc: BaseException) -> bool:
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    unknown = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
    return isinstance(error, KafkaError) and error.code() in unknown


def similar_topics(admin, topic: str, timeout: float = 10.0) -> list[str]:
    """Topics of the cluster whose names are close to `topic` (for a "did you mean"); [] if the
    cluster cannot list them (no Describe on them, say)."""
    import difflib

    try:
        names = [name for name in admin.list_topics(timeout=timeout).topics if not name.startswith("__")]
    except Exception:
        return []
    return difflib.get_close_matches(topic, names, n=3, cutoff=0.6)


def missing_topic(what: str, topic: str, bootstrap: str, admin: Any, hint: str | None = None) -> Exception:
    """The error for a topic that does not exist: the environment's, not the file's (the topic may
    just not be created yet), with the cluster's topics of a similar name."""
    from eos.api import EnvironmentProblem

    close = similar_topics(admin, topic)
    suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return EnvironmentProblem(f"{what}: topic {topic!r} does not exist on {bootstrap}{suggestion}", hint=hint)


def create_topic(
    admin, name: str, partitions: int = 1, replication: int = -1, config: Mapping[str, str] | None = None
) -> bool:
    """Create a topic if it does not exist; returns True if it was created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    futures = admin.create_topics(
        [NewTopic(name, partitions, replication, config=dict(config or {}))], operation_timeout=30
    )
    try:
        futures[name].result()
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    return True


def reachable(what: str, bootstrap: str, call: Any) -> Any:
    """Run a start-up call with bounded retries while the cluster is unreachable (a broker may be
    restarting), then a clear message. Defaults: 3 attempts 5 s apart (EOS_STARTUP_ATTEMPTS,
    EOS_STARTUP_RETRY_WAIT_S change them)."""
    import os
    import time

    from eos.api import EnvironmentProblem

    attempts = max(1, int(os.environ.get("EOS_STARTUP_ATTEMPTS", "3")))
    wait_s = float(os.environ.get("EOS_STARTUP_RETRY_WAIT_S", "5"))
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            refused = _refused(bootstrap)
            if refused:  # nothing listens: no need to wait out a request timeout to know
                raise BrokerUnreachable(refused)
            return call()
        except NotAuthorized:
            raise  # an answer, not an outage: the caller names the missing ACL
        except NotAuthenticated as exc:  # an answer, not an outage: no retry helps
            raise EnvironmentProblem(
                f"{what}: Kafka at {bootstrap} refused this client's credentials ({exc})",
                hint="check the entry's `config:` (sasl.mechanism, sasl.username, sasl.password, or the TLS "
                "certificate and key); `eos acls PIPELINE` lists the principals a pipeline uses",
            ) from None
        except BrokerUnreachable as exc:
            if attempt == attempts:
                raise EnvironmentProblem(
                    f"{what}: cannot reach Kafka at {bootstrap} after {attempts} attempts over "
                    f"{time.monotonic() - started:.0f} s ({exc})",
                    hint="is the broker running (`eos kafka status`) and is bootstrap right? A cluster that takes TLS "
                    "or SASL needs them in the entry's `config:` (security.protocol, ...)",
                ) from None
            log.warning("%s: Kafka at %s unreachable (attempt %d/%d), retrying", what, bootstrap, attempt, attempts)
            print(f"eos: {what}: Kafka at {bootstrap} unreachable (attempt {attempt}/{attempts}), retrying",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def _refused(bootstrap: str, timeout_s: float = 1.0) -> str:
    """A reason if every bootstrap server refuses a TCP connection (or its name does not resolve);
    "" if one accepts, or if any is slow to answer (then the client's own timeout decides)."""
    import socket

    reasons = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return ""
        except (ConnectionRefusedError, socket.gaierror, ValueError) as exc:
            reasons.append(f"{server.strip()}: {exc.strerror if hasattr(exc, 'strerror') and exc.strerror else exc}")
        except OSError:
            return ""
    return "; ".join(reasons)


class UnknownTopic(Exception):
    def __init__(self, topic: str):
        super().__init__(topic)
        self.topic = topic


class BrokerUnreachable(Exception):
    pass


class NotAuthenticated(BrokerUnreachable):
    """The cluster refused the client's credentials (a BrokerUnreachable to callers that only
    retry or report it)."""


class NotAuthorized(BrokerUnreachable):
    """The brokers refused for want of an ACL (a BrokerUnreachable to callers that only retry or
    report; start-up checks name the ACL: eos_connectors.kafka.access)."""


# ---------------------------------------------------------------------------------------------
# Error classification (used with tenacity)
# ---------------------------------------------------------------------------------------------


def kafka_error(exc: BaseException):
    """The KafkaError inside a KafkaException, if any."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_retriable(exc: BaseException) -> bool:
    error = kafka_error(exc)
    return bool(error and error.retriable() and not error.fatal() and not error.txn_requires_abort())


def requires_abort(exc: BaseException) -> bool:
    error = kafka_error(exc)
    return bool(error and error.txn_requires_abort())


def is_fatal(exc: BaseException) -> bool:
    error = kafka_error(exc)
    return bool(error and error.fatal())


def is_refused(exc: BaseException) -> bool:
    """The cluster's authorizer refused the principal (no ACL allows it)."""
    from confluent_kafka import KafkaError

    error = kafka_error(exc)
    refused = (
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    )
    return bool(error and error.code() in refused)


def is_fenced(exc: BaseException) -> bool:
    """A newer producer with the same transactional id exists: this one can never commit again."""
    from confluent_kafka import KafkaError

    error = kafka_error(exc)
    fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    return bool(error and (error.code() in fenced or error.fatal()))


def is_indefinite(exc: BaseException) -> bool:
    """A timeout: the request may still be in flight and land later (in a later transaction of
    the same producer, on the transaction protocol librdkafka speaks)."""
    from confluent_kafka import KafkaError

    error = kafka_error(exc)
    timeouts = (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT_QUEUE)
    return bool(error and error.code() in timeouts)


# ---------------------------------------------------------------------------------------------
# Offsets
# ---------------------------------------------------------------------------------------------


def end_offsets(
    admin, partitions: Mapping[str, Iterable[int]], read_committed: bool = True, timeout: float = 15.0
) -> dict[tuple[str, int], int]:
    """Latest offset of each partition: the last stable offset (LSO) for read_committed, else the
    high watermark. Records at or beyond the LSO may still belong to an open transaction."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    request = {TopicPartition(t, p): OffsetSpec.latest() for t, ps in partitions.items() for p in ps}
    if not request:
        return {}
    level = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    return _list_offsets(admin, request, timeout, isolation_level=level)


def start_offsets(admin, partitions: Mapping[str, Iterable[int]], timeout: float = 15.0) -> dict[tuple[str, int], int]:
    """Earliest available offset of each partition (the log start, after retention)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    request = {TopicPartition(t, p): OffsetSpec.earliest() for t, ps in partitions.items() for p in ps}
    if not request:
        return {}
    return _list_offsets(admin, request, timeout)


def _list_offsets(admin, request: dict, timeout: float, **options: Any) -> dict[tuple[str, int], int]:
    """list_offsets, retried while a partition's leader is not known yet: a topic created a moment
    before (or a leader that just moved) answers NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE
    for a few hundred ms. The callers checked that the topics exist before."""
    from confluent_kafka import KafkaError
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

    passing = (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
    )

    def passes(exc: BaseException) -> bool:
        error = kafka_error(exc)
        return is_retriable(exc) or bool(error and error.code() in passing)

    def once() -> dict[tuple[str, int], int]:
        futures = admin.list_offsets(request, request_timeout=timeout, **options)
        return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}

    wait = wait_exponential(multiplier=0.05, max=1)
    return retry(retry=retry_if_exception(passes), stop=stop_after_delay(timeout), wait=wait, reraise=True)(once)()

"""Pre-flight authorization: before eos writes anything, ask the cluster whether each client may
do what `eos run` needs (eos_connectors.kafka.acls), and name every ACL that is missing, its
principal, and the kafka-acls line that grants it.

How each kind of ACL is asked, without writing anything:
- topics: DescribeTopics with the principal's authorized operations (implied ones included). A
  topic eos is about to create: CreateTopics with validate_only; the topic's other operations
  are asked once eos has created it (`check_created`), still before any record is written;
- groups: DescribeGroups with the authorized operations;
- a sink's pool of transactional ids: `init_transactions` on `<pool prefix>~probe`, an id under
  the pool's prefix that is never a pool id (those are numbers), so it fences no one; it also
  tells whether the brokers accept the sink's `transaction.timeout.ms`;
- the driver's transactional id is asked by the take-over's own `init_transactions`, before it
  writes (probing it earlier would fence a driver that may still run);
- cluster DescribeConfigs is optional: KafkaSink.check reads `transaction.max.timeout.ms` with it
  when it may, and the probe checks the timeout either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eos.api import ConfigError, EnvironmentProblem
from eos_connectors.kafka import acls
from eos_connectors.kafka.acls import GROUP, PREFIXED, RUN, TOPIC, TXN, Need
from eos_connectors.kafka.clients import (
    BrokerUnreachable,
    admin_client,
    is_refused,
    is_retriable,
    kafka_error,
    producer,
    reachable,
)

log = logging.getLogger("eos.kafka.access")
# A refused probe is an answer, not an incident: librdkafka's FATAL lines about it stay out of the
# eos.kafka log (the CLI shows its errors), the error that names the ACL says it all.
_quiet = logging.getLogger("eos.kafka.access.probe")
_quiet.propagate = False
_quiet.addHandler(logging.NullHandler())

PROBE_SUFFIX = "~probe"  # never a pool number: see eos_connectors.kafka.ids
TRANSIENT = ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")


class AccessDenied(EnvironmentProblem):
    """A principal lacks an ACL eos needs: names the ACL, the principal, and the fix."""


def principal(client: Mapping[str, Any], who: str) -> str:
    try:
        return acls.principal_of(client)
    except acls.UnknownPrincipal:
        return f"User:<the principal of {who}>"


# ---------------------------------------------------------------------------------------------
# Asking the cluster
# ---------------------------------------------------------------------------------------------


@dataclass
class Findings:
    missing: list[tuple[Need, str]] = field(default_factory=list)  # (need, what the brokers answered)
    deferred: list[Need] = field(default_factory=list)  # needs on a topic eos has yet to create


def _operation(name: str) -> str:
    """Kafka's ACL operation name in confluent-kafka's enum spelling (DescribeConfigs -> DESCRIBE_CONFIGS)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def probe(client: Mapping[str, Any], needs: Iterable[Need], admin: Any = None, timeout_s: float = 15.0,
          transaction_timeout_ms: int | None = None) -> Findings:  # fmt: skip
    """Ask the cluster about every need (of one client); literal transactional ids are asked
    only if listed (that fences them), cluster operations not at all."""
    needs = list(needs)
    admin = admin or admin_client(client)
    found = Findings()
    jobs = [
        lambda: _topics(admin, [n for n in needs if n.acl.resource == TOPIC], timeout_s),
        lambda: _groups(admin, [n for n in needs if n.acl.resource == GROUP], timeout_s),
    ]
    transactional: dict[Any, list[Need]] = {}
    for need in needs:
        if need.acl.resource == TXN and need.acl.operation == "Write":
            transactional.setdefault(need.acl, []).append(need)
    for same in transactional.values():
        jobs.append(lambda same=same: _transactional(client, same, timeout_s, transaction_timeout_ms))  # type: ignore[misc]
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="eos-access") as pool:
        for result in pool.map(lambda job: job(), jobs):
            found.missing += result.missing
            found.deferred += result.deferred
    return found


def _topics(admin: Any, needs: list[Need], timeout_s: float) -> Findings:
    from confluent_kafka import KafkaException, TopicCollection

    found = Findings()
    names = sorted({n.acl.name for n in needs})
    if not names:
        return found
    described = admin.describe_topics(
        TopicCollection(names), request_timeout=timeout_s, include_authorized_operations=True
    )
    for name, future in described.items():
        here = [n for n in needs if n.acl.name == name]
        try:
            operations = future.result().authorized_operations
        except KafkaException as exc:
            error = kafka_error(exc)
            code = error.name() if error is not None else ""
            if code in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC"):
                found.missing += _create(admin, name, [n for n in here if n.acl.operation == "Create"], timeout_s)
                found.deferred += [n for n in here if n.acl.operation != "Create"]
                continue
            if code != "TOPIC_AUTHORIZATION_FAILED":
                raise BrokerUnreachable(str(exc)) from None
            # No Describe: whether the topic exists, and what else may be done, is not told. Missing
            # are the needs that would grant Describe (Read, Write, ...); what eos would create is asked.
            implying = [n for n in here if n.acl.operation in ("Describe", *acls.IMPLIES["Describe"])]
            found.missing += [(n, code) for n in implying or [n for n in here if n.acl.operation != "Create"]]
            found.missing += _create(admin, name, [n for n in here if n.acl.operation == "Create"], timeout_s)
            continue
        if operations is None:  # a broker that does not tell: nothing to conclude
            continue
        allowed = {op.name for op in operations}
        for need in here:
            if need.acl.operation != "Create" and _operation(need.acl.operation) not in allowed:
                found.missing.append((need, f"allowed operations: {', '.join(sorted(allowed)) or 'none'}"))
    return found


def _create(admin: Any, topic: str, needs: list[Need], timeout_s: float) -> list[tuple[Need, str]]:
    """May this principal create `topic`? (CreateTopics, validate_only: nothing is created.)"""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    if not needs:
        return []
    try:
        admin.create_topics([NewTopic(topic, 1, -1)], validate_only=True, request_timeout=timeout_s)[topic].result()
    except KafkaException as exc:
        if is_refused(exc):
            return [(n, str(kafka_error(exc).name())) for n in needs]
    return []


def _groups(admin: Any, needs: list[Need], timeout_s: float) -> Findings:
    from confluent_kafka import KafkaException

    found = Findings()
    deadline = time.monotonic() + timeout_s
    for name in sorted({n.acl.name for n in needs}):
        here = [n for n in needs if n.acl.name == name]
        while True:
            try:
                described = admin.describe_consumer_groups(
                    [name], include_authorized_operations=True, request_timeout=timeout_s
                )[name].result()
                break
            except KafkaException as exc:
                error = kafka_error(exc)
                if is_refused(exc):
                    found.missing += [(n, error.name()) for n in here]
                    described = None
                    break
                # A new cluster creates and loads its group coordinator's topic on first use.
                if error is None or error.name() not in TRANSIENT or time.monotonic() > deadline:
                    raise BrokerUnreachable(str(exc)) from None
                time.sleep(0.2)
        if described is not None and described.authorized_operations is not None:
            allowed = {op.name for op in described.authorized_operations}
            found.missing += [(n, f"allowed operations: {', '.join(sorted(allowed)) or 'none'}")
                              for n in here if _operation(n.acl.operation) not in allowed]  # fmt: skip
    return found


def _transactional(client: Mapping[str, Any], needs: list[Need], timeout_s: float, timeout_ms: int | None) -> Findings:
    """init_transactions on the probe id of a prefix (or on the literal id itself)."""
    acl = needs[0].acl
    txid = acl.name + PROBE_SUFFIX if acl.pattern == PREFIXED else acl.name
    config = {**client, "transactional.id": txid, "logger": _quiet}
    if timeout_ms is not None:
        config["transaction.timeout.ms"] = timeout_ms
    instance = producer(config)
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # a new cluster creates and loads its transaction log on first use: retriable
            try:
                instance.init_transactions(max(1.0, deadline - time.monotonic()))
                break
            except Exception as exc:
                if not is_retriable(exc) or time.monotonic() > deadline:
                    raise
    except Exception as exc:
        error = kafka_error(exc)
        if is_refused(exc):
            return Findings(missing=[(need, error.name()) for need in needs])
        if error is not None and error.name() == "INVALID_TRANSACTION_TIMEOUT":
            raise TimeoutRefused(timeout_ms) from None
        raise BrokerUnreachable(f"init_transactions({txid}): {error or exc}") from None
    finally:
        with contextlib.suppress(Exception):  # a producer with a fatal error raises on close
            instance.close(5)
    return Findings()


class TimeoutRefused(Exception):
    """The brokers refuse the transaction timeout (transaction.max.timeout.ms is lower)."""

    def __init__(self, timeout_ms: int | None):
        super().__init__(timeout_ms)
        self.timeout_ms = timeout_ms


# ---------------------------------------------------------------------------------------------
# What is missing, told
# ---------------------------------------------------------------------------------------------


def explain(missing: list[tuple[Need, str]], then: str = "it stops before anything was written") -> AccessDenied:
    """One error for every missing ACL: what, whose, why, what the brokers said, the fix."""
    by_acl: dict[Any, list[tuple[Need, str]]] = {}
    for need, answer in missing:
        by_acl.setdefault(need.acl, []).append((need, answer))
    principals = sorted({acl.principal for acl in by_acl})
    lines = [f"{' and '.join(principals)} may not do what eos run needs ({len(by_acl)} Kafka ACLs missing); {then}:"]
    for acl, uses in by_acl.items():
        by_client: dict[str, list[str]] = {}
        for need, _ in uses:
            if need.why not in by_client.setdefault(need.client, []):
                by_client[need.client].append(need.why)
        whys = "; ".join(f"{client}: {'; '.join(reasons)}" for client, reasons in by_client.items())
        lines.append(f"  - {acl.principal} may not {acl.describe()} at {acl.bootstrap} (the brokers answered "
                     f"{uses[0][1]}). {whys}")  # fmt: skip
    fixes = "\n    ".join(acls.kafka_acls_command(acl, "ADMIN.properties") for acl in by_acl)
    hint = f"grant them as a Kafka administrator:\n    {fixes}\n"
    hint += "  `eos acls PIPELINE.yaml` lists every ACL the pipeline needs, and why"
    return AccessDenied("\n".join(lines), hint=hint)


def require(client: Mapping[str, Any], needs: Iterable[Need], admin: Any = None, **options: Any) -> list[Need]:
    """Raise AccessDenied for every missing need of `run` (optional ones are warned about);
    returns the needs on topics that do not exist yet."""
    needs = [n for n in needs if n.command == RUN]
    if not needs:
        return []
    bootstrap, who = needs[0].acl.bootstrap, needs[0].client
    found = reachable(who, bootstrap, lambda: probe(client, needs, admin, **options))
    required = [(n, answer) for n, answer in found.missing if not n.optional]
    if required:
        raise explain(required)
    for need, answer in found.missing:
        warn(f"{need.acl.principal} may not {need.acl.describe()} ({answer}): {need.why}")
    return found.deferred


def warn(message: str) -> None:
    log.warning(message)
    print(f"eos: warning: {message}", file=sys.stderr, flush=True)


# Needs on topics that did not exist when they were checked: asked again once eos created the
# topic (by bootstrap, principal and topic).
_deferred: dict[tuple[str, str, str], list[Need]] = {}
_deferred_lock = threading.Lock()


def defer(needs: Iterable[Need]) -> None:
    with _deferred_lock:
        for need in needs:
            _deferred.setdefault((need.acl.bootstrap, need.acl.principal, need.acl.name), []).append(need)


def check_created(client: Mapping[str, Any], who: str, topic: str, admin: Any = None, wait_s: float = 10.0) -> None:
    """The needs deferred for `topic` (it did not exist at the check), now that eos created it."""
    key = (str(client.get("bootstrap.servers")), principal(client, who), topic)
    with _deferred_lock:
        needs = _deferred.pop(key, [])
    deadline = time.monotonic() + wait_s
    while needs:  # a topic created a moment ago may not be known yet to the broker asked
        needs = require(client, needs, admin)
        if needs and time.monotonic() > deadline:
            raise EnvironmentProblem(f"{who}: topic {topic} was created but is not visible after {wait_s:.0f} s")
        if needs:
            time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# The connectors' checks (their check() and take-over call these)
# ---------------------------------------------------------------------------------------------


def source_needs(source: Any) -> list[Need]:
    kafka, who = source.entry.kafka, f"source {source.name}"
    return acls.source_needs(
        who, kafka.bootstrap, principal(source.client, who), source.pipeline.name, kafka.topics, source.group_id
    )


def check_source(source: Any) -> None:
    """KafkaSource.check: its topics, the groups its consumers name."""
    require(source.client, source_needs(source), source.admin)


def sink_who(sink: Any) -> str:
    # Dead-letter queues are sinks named `<source>.dlq`; a configured sink's name has no dot.
    return f"dead-letter queue {sink.name}" if "." in sink.name else f"sink {sink.name}"


def sink_needs(sink: Any) -> list[Need]:
    from eos_connectors.kafka import ids

    kafka, who = sink.entry.kafka, sink_who(sink)
    prefix = ids.pool_id(sink.prefix, sink.name, 0)[:-1]
    ledger, exactly_once = sink.pipeline.ledger, sink.pipeline.exactly_once
    user = principal(sink.client, who)
    return acls.sink_needs(who, kafka.bootstrap, user, kafka.topic, kafka.create_topic, prefix, ledger, exactly_once)


def transaction_timeout_ms(sink: Any) -> int:
    """The transaction.timeout.ms the sink's producers ask for (KafkaWriterFactory.config)."""
    from eos_connectors.kafka.sink import transaction_timeout_s

    override = sink.client.get("transaction.timeout.ms")
    return int(override) if override is not None else int(transaction_timeout_s(sink.pipeline.epoch_timeout_s) * 1000)


def check_sink(sink: Any, admin: Any, limit: Any = None) -> None:
    """KafkaSink.check: its topic, the ledger and its pool of transactional ids (whose probe also
    checks the transaction timeout). `limit`: the future of the brokers' transaction.max.timeout.ms."""
    needs = [n for n in sink_needs(sink) if n.acl.resource != acls.CLUSTER]
    timeout_ms = transaction_timeout_ms(sink) if sink.pipeline.exactly_once else None
    try:
        defer(require(sink.client, needs, admin, transaction_timeout_ms=timeout_ms))
    except TimeoutRefused:
        known = transaction_limit(sink, limit)
        if known is not None:
            sink._check_transaction_timeout(known)  # the error that names the limit
        raise ConfigError(
            f"{sink_who(sink)}: the brokers at {sink.entry.kafka.bootstrap} refuse transaction.timeout.ms={timeout_ms} "
            "(above their transaction.max.timeout.ms, which this principal may not read: it has no DescribeConfigs "
            "on the cluster)",
            hint="lower epochs.timeout (transactions last twice as long), or set transaction.timeout.ms in the sink's "
            "config: below the brokers' limit; or raise transaction.max.timeout.ms on the brokers",
        ) from None


def transaction_limit(sink: Any, limit: Any) -> str | None:
    """The brokers' transaction.max.timeout.ms from `limit` (a future of broker_setting), or None
    when this principal may not read it (cluster DescribeConfigs is optional: say so)."""
    if limit is None:
        return None
    try:
        return limit.result()
    except Exception as exc:
        if not is_refused(exc):
            raise
    user = principal(sink.client, sink_who(sink))
    print(f"eos: {sink_who(sink)}: {user} may not read the brokers' transaction.max.timeout.ms (no DescribeConfigs "
          f"on the cluster, an optional ACL); transaction.timeout.ms={transaction_timeout_ms(sink)} was checked by "
          "a transactional-id probe instead", file=sys.stderr, flush=True)  # fmt: skip
    return None


def control_needs(control: Any, driver: bool = False) -> list[Need]:
    """The control log's needs for run; the driver's id only if `driver` (probing it fences it)."""
    source = control.client.get("bootstrap.servers")
    needs = acls.control_needs(str(source), principal(control.client, "control log"), control.topic, control.txid)
    return [n for n in needs if n.command == RUN and (driver or n.acl.resource != TXN)]


def check_control(control: Any) -> None:
    """KafkaControlLog.take_over, before it creates or writes anything."""
    defer(require(control.client, control_needs(control), control.admin))


def driver_denied(control: Any, exc: BaseException) -> AccessDenied | None:
    """The take-over's init_transactions on the driver's id was refused for want of an ACL."""
    if not is_refused(exc):
        return None
    needs = acls.control_needs(
        str(control.client.get("bootstrap.servers")), principal(control.client, "control log"), control.topic,
        control.txid,
    )  # fmt: skip
    return explain([(n, kafka_error(exc).name()) for n in needs if n.acl.resource == TXN and n.command == RUN])


def recovery_needs(sinks: list[Any]) -> list[Need]:
    """What recovery asks of the first sink of a cluster: read the ledger."""
    first = sinks[0]
    user, bootstrap = principal(first.client, sink_who(first)), first.entry.kafka.bootstrap
    needs = acls.recovery_needs([(sink_who(first), bootstrap, user)], first.pipeline.ledger)
    return [n for n in needs if n.command == RUN]


def check_ledger_read(sinks: list[Any]) -> None:
    """KafkaSink.read_ledger failed: for want of an ACL of the first sink of the cluster? Then say which."""
    require(sinks[0].client, recovery_needs(sinks))


# ---------------------------------------------------------------------------------------------
# A whole pipeline, without Spark (`eos acls --check`, tests)
# ---------------------------------------------------------------------------------------------


def check_pipeline(config: Any, base_dir: Any = None, probe_driver: bool = False) -> Findings:
    """Ask the cluster about every ACL `eos run` needs for `config` (a validated PipelineConfig),
    as each of its Kafka clients, with the checks eos run makes (at its checks, its take-over and
    its recovery), without writing anything. `probe_driver`: also init_transactions on the
    driver's id, which fences a running driver: only for a pipeline that is stopped.
    Needs on topics that do not exist yet come back as `deferred`."""
    from eos.api import PipelineInfo
    from eos_connectors.kafka.config import KafkaSinkEntry, KafkaSourceEntry
    from eos_connectors.kafka.sink import KafkaSink
    from eos_connectors.kafka.source import KafkaSource

    info = PipelineInfo(
        config.name, "(check)", config.exactly_once, config.epochs.timeout, base_dir, config.ledger_topic
    )
    sources = [KafkaSource(e, info) for e in config.sources if isinstance(e, KafkaSourceEntry)]
    sinks: list[Any] = [KafkaSink(e, info) for e in config.sinks if isinstance(e, KafkaSinkEntry)]
    sinks += [dlq for dlq in (source.dead_letters() for source in sources) if dlq is not None]
    asks: list[tuple[Mapping[str, Any], list[Need], int | None]] = []
    asks += [(source.client, source_needs(source), None) for source in sources]
    for sink in sinks:
        timeout_ms = transaction_timeout_ms(sink) if config.exactly_once else None
        asks.append((sink.client, [n for n in sink_needs(sink) if n.acl.resource != acls.CLUSTER], timeout_ms))
    if config.exactly_once and sources and isinstance(config.sources[0], KafkaSourceEntry):
        control = sources[0].control_log()
        asks.append((control.client, control_needs(control, driver=probe_driver), None))
        by_cluster: dict[str, list[Any]] = {}
        for sink in sinks:
            by_cluster.setdefault(sink.entry.kafka.bootstrap, []).append(sink)
        asks += [(group[0].client, recovery_needs(group), None) for group in by_cluster.values()]
    # One probe per client: one admin connection, each transactional id asked once.
    by_client: dict[str, list[Any]] = {}
    for client, needs, timeout_ms in asks:
        known = by_client.setdefault(json.dumps(dict(client), sort_keys=True, default=str), [client, [], None])
        known[1] += [n for n in needs if n.command == RUN]
        known[2] = known[2] or timeout_ms
    found = Findings()
    for client, needs, timeout_ms in by_client.values():
        where = str(client.get("bootstrap.servers"))
        result = reachable("checking ACLs", where, lambda: probe(client, needs, transaction_timeout_ms=timeout_ms))  # noqa: B023
        found.missing += result.missing
        found.deferred += result.deferred
    return found

"""The Kafka ACLs a pipeline needs, computed from its file: pure logic, no Kafka (`eos acls`).

Every entry is derived from a call the connector makes, named in its `why`, and says which
command needs it: `run` (eos run, with its lag watch), `status` (eos status, read-only unless
--fence) and `reset` (eos reset). Nothing else is listed. How each client is used:

- a source's client reads its topics (Read; Kafka lets Read imply Describe, which metadata,
  topic ids and offsets need), looks up the coordinator of the group every librdkafka consumer
  must name though eos's readers never join one (`eos-unused`: Describe), and commits each
  committed epoch's ends to the source's lag group for monitors (Read; optional);
- its dead-letter queue is a Kafka sink with the source's client (`<source>.dlq`);
- the first source's client keeps the control log (`<ledger>.control`, transactional id
  `eos/<pipeline>/~driver`);
- a sink's client produces into its topic and, exactly-once, into the ledger topic in the
  transactions of its pool of transactional ids (`<prefix>/<sink>/<n>`: granted by prefix, the pool
  grows), which recovery fences with the same client; recovery reads the ledger through the first
  Kafka sink of each cluster, `eos status` through every sink's client.

A topic eos creates needs Create only while it does not exist (a first start); Kafka 3.0+ needs
no IdempotentWrite for an idempotent producer that may Write a topic (KIP-679), and asks no ACL
for DescribeCluster or a metadata request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RUN, STATUS, RESET = "run", "status", "reset"
COMMANDS = (RUN, STATUS, RESET)
TOPIC, GROUP, TXN, CLUSTER = "topic", "group", "transactional-id", "cluster"
LITERAL, PREFIXED = "literal", "prefixed"
UNUSED_GROUP = "eos-unused"  # every eos consumer's group.id (clients.consumer); never joined
# Kafka's implied operations (org.apache.kafka.common.acl.AclOperation, the authorizer):
# Read, Write, Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs.
IMPLIES = {"Describe": ("Read", "Write", "Delete", "Alter"), "DescribeConfigs": ("AlterConfigs",)}
# librdkafka's default SASL mechanism when none is set.
DEFAULT_MECHANISM = "GSSAPI"
NAMED_BY_USERNAME = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding (host `*`)."""

    bootstrap: str
    principal: str
    resource: str  # topic, group, transactional-id, cluster
    name: str  # "kafka-cluster" for the cluster
    pattern: str  # literal or prefixed
    operation: str  # Kafka's name: Read, Write, Create, Delete, Describe, DescribeConfigs

    def describe(self) -> str:
        where = "the cluster" if self.resource == CLUSTER else f"{self.resource} {self.name}"
        if self.pattern == PREFIXED:
            where = f"{self.resource}s prefixed {self.name!r}"
        return f"{self.operation} on {where}"


@dataclass(frozen=True)
class Need:
    """One use of an ACL by one client: `why`, for which command, and whether it may be missing."""

    acl: Acl
    command: str
    why: str
    client: str  # "source events", "sink out", "dead-letter queue events.dlq", "control log"
    optional: bool = False
    only_if: str | None = None  # a condition: "the topic does not exist yet"


@dataclass
class Entry:
    """An ACL with every use of it merged."""

    acl: Acl
    commands: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    optional: bool = True
    only_if: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bootstrap": self.acl.bootstrap,
            "principal": self.acl.principal,
            "resource_type": self.acl.resource,
            "resource_name": self.acl.name,
            "pattern_type": self.acl.pattern,
            "operation": self.acl.operation,
            "commands": self.commands,
            "optional": self.optional,
            "only_if": self.only_if,
            "clients": self.clients,
            "why": self.why,
        }


# ---------------------------------------------------------------------------------------------
# Principals
# ---------------------------------------------------------------------------------------------


class UnknownPrincipal(ValueError):
    """The client authenticates in a way that does not tell its principal's name."""


def principal_of(client: Mapping[str, Any]) -> str:
    """The principal the brokers see for a librdkafka client config: `User:<sasl.username>` for
    SASL PLAIN and SCRAM, `User:ANONYMOUS` for PLAINTEXT and TLS without a client certificate.
    Raises UnknownPrincipal (with the reason) for GSSAPI, OAUTHBEARER and TLS client certificates:
    the brokers map those to a principal eos cannot compute."""
    protocol = str(client.get("security.protocol", "plaintext")).upper()
    if protocol == "PLAINTEXT":
        return "User:ANONYMOUS"
    if protocol == "SSL":
        if any(client.get(k) for k in ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")):
            raise UnknownPrincipal("it authenticates with a TLS client certificate (the brokers map its subject)")
        return "User:ANONYMOUS"
    mechanism = str(client.get("sasl.mechanism", client.get("sasl.mechanisms", DEFAULT_MECHANISM))).upper()
    if mechanism not in NAMED_BY_USERNAME:
        raise UnknownPrincipal(f"it authenticates with SASL {mechanism} (the brokers map its identity)")
    username = client.get("sasl.username")
    if not username:
        raise UnknownPrincipal(f"it uses SASL {mechanism} without sasl.username")
    return f"User:{username}"


def resolve_principal(client: Mapping[str, Any], who: str, given: Mapping[str, str]) -> str:
    """`given` (from --principal) by connector name (`who` without its kind), else "*" for all,
    else computed from the client's settings."""
    name = who.split(" ", 1)[-1]
    for key in (name, name.removesuffix(".dlq"), "*"):
        if key in given:
            return given[key]
    return principal_of(client)


# ---------------------------------------------------------------------------------------------
# What each client needs
# ---------------------------------------------------------------------------------------------

# Why each use exists: the function that makes the call.
WHY_READ = (
    "the source reads it (reader.read_ranges); Read implies the Describe its metadata, topic ids and offsets need"
)
WHY_UNUSED = (
    f"librdkafka looks up the coordinator of the group.id every consumer must have ({UNUSED_GROUP}, "
    "clients.consumer), though eos's readers never join or commit: without it every read fails "
    "with GROUP_AUTHORIZATION_FAILED. It grants nothing: no one commits to that group"
)
WHY_FENCE = "recovery fences every id of the pool with its own sink's client (KafkaSink.fence)"
WHY_LISTED = (
    "status lists the open transactions of its ids (Kafka's TransactionsCommand, eos_ops.status); without it "
    "they are not listed"
)
WHY_LAG_GROUP = (
    "each committed epoch's end offsets are committed to the source's group for lag monitors (group_offsets); "
    "monitoring only: without it eos logs a warning and monitors see no progress"
)


def source_needs(
    who: str, bootstrap: str, principal: str, pipeline: str, topics: Iterable[str], group: str
) -> list[Need]:
    def need(resource: str, name: str, op: str, command: str, why: str, optional: bool = False) -> Need:
        return Need(Acl(bootstrap, principal, resource, name, LITERAL, op), command, why, who, optional)

    out = []
    for topic in topics:
        out.append(need(TOPIC, topic, "Read", RUN, WHY_READ))
        out.append(need(TOPIC, topic, "Describe", STATUS, "status shows the source's lag (list_offsets)"))
    out.append(need(GROUP, UNUSED_GROUP, "Describe", RUN, WHY_UNUSED))
    out.append(need(GROUP, group, "Read", RUN, WHY_LAG_GROUP, optional=True))
    return out


def sink_needs(
    who: str,
    bootstrap: str,
    principal: str,
    topic: str,
    create_topic: bool,
    pool_prefix: str,
    ledger: str,
    exactly_once: bool,
) -> list[Need]:
    """A Kafka sink's own uses (a dead-letter queue's too: `create_topic` is then true). What
    depends on its place among the sinks (reading the ledger, fencing others' pools) is added by
    `pipeline_needs`."""

    def need(resource: str, name: str, op: str, command: str, why: str, **kw: Any) -> Need:
        pattern = kw.pop("pattern", LITERAL)
        return Need(Acl(bootstrap, principal, resource, name, pattern, op), command, why, who, **kw)

    out = [
        need(TOPIC, topic, "Write", RUN, "the slots produce the epoch's rows (sink.KafkaWriter); Write implies the "
             "Describe check() needs"),
        need(TOPIC, topic, "Describe", STATUS, "status looks for lingering transactions (sink.lingering)"),
    ]  # fmt: skip
    if create_topic:
        out.append(need(TOPIC, topic, "Create", RUN, "check() creates it", only_if="the topic does not exist yet"))
    if not exactly_once:  # an idempotent producer, no ledger, no transactions
        return out
    out += [
        need(TXN, pool_prefix, "Write", RUN, "each slot's transactional producer (init_transactions, its "
             "transactions); the pool grows with the slots, hence a prefix", pattern=PREFIXED),
        need(TXN, pool_prefix, "Write", RUN, WHY_FENCE, pattern=PREFIXED),
        need(TXN, pool_prefix, "Write", RESET, WHY_FENCE, pattern=PREFIXED),
        need(TXN, pool_prefix, "Write", STATUS, WHY_FENCE, pattern=PREFIXED, only_if="eos status --fence"),
        need(TXN, pool_prefix, "Describe", STATUS, WHY_LISTED, pattern=PREFIXED, optional=True),
        need(TOPIC, ledger, "Write", RUN, "each slot writes its ledger entry in its transaction"),
        need(TOPIC, ledger, "DescribeConfigs", RUN, "set_up checks that the ledger topic is compacted "
             "(ledger.ensure_ledger_topic)"),
        need(TOPIC, ledger, "Create", RUN, "set_up creates the ledger topic", only_if="the topic does not exist yet"),
        need(TOPIC, ledger, "Read", STATUS, "status reads the ledger through every sink's client"),
        need(GROUP, UNUSED_GROUP, "Describe", STATUS, WHY_UNUSED),
        need(TOPIC, ledger, "Describe", STATUS, "status looks for lingering transactions (sink.lingering)"),
        need(CLUSTER, "kafka-cluster", "DescribeConfigs", RUN, "check() reads the brokers' "
             "transaction.max.timeout.ms to explain a transaction timeout they refuse; without it the probe of "
             "the pool's transactional ids still checks the timeout", optional=True),
    ]  # fmt: skip
    return out


def control_needs(bootstrap: str, principal: str, topic: str, driver_id: str) -> list[Need]:
    """The control log, through the first source's client (exactly-once only)."""

    def need(resource: str, name: str, op: str, command: str, why: str, **kw: Any) -> Need:
        return Need(Acl(bootstrap, principal, resource, name, LITERAL, op), command, why, "control log", **kw)

    out = []
    for command in (RUN, RESET):  # reset takes the pipeline over as a new driver would
        out += [
            need(TXN, driver_id, "Write", command, "the take-over's init_transactions fences every earlier driver; "
                 "each control record is a transaction of this id"),
            need(TOPIC, topic, "Write", command, "the driver records itself, its decisions and its pools"),
            need(TOPIC, topic, "Read", command, "the take-over reads the last decision and pools (the lag watch "
                 "reads the last driver)"),
            need(TOPIC, topic, "DescribeConfigs", command, "the take-over checks that the control topic is "
                 "compacted (ledger.ensure_ledger_topic)"),
            need(TOPIC, topic, "Create", command, "the take-over creates the control topic",
                 only_if="the topic does not exist yet"),
        ]  # fmt: skip
    out += [
        need(TOPIC, topic, "Read", STATUS, "status reads the driver, decision and pools"),
        need(TXN, driver_id, "Describe", STATUS, WHY_LISTED, optional=True),
        need(GROUP, UNUSED_GROUP, "Describe", RUN, WHY_UNUSED),
        need(TOPIC, topic, "Delete", RESET, "reset deletes the control topic (control.reset)"),
    ]
    return out


# ---------------------------------------------------------------------------------------------
# A whole pipeline
# ---------------------------------------------------------------------------------------------


def pipeline_needs(config: Any, principals: Mapping[str, str] | None = None) -> list[Need]:
    """Every use of an ACL by a pipeline (a validated PipelineConfig); `principals` by connector
    name or "*" (from --principal). Raises UnknownPrincipal naming the connector to give one for.
    Sources and sinks of other kinds need no Kafka ACL and are skipped."""
    from eos_connectors.kafka import ids
    from eos_connectors.kafka.config import KafkaSinkEntry, KafkaSourceEntry

    given = dict(principals or {})
    ledger = config.ledger_topic
    exactly_once = config.exactly_once
    needs: list[Need] = []
    sinks: list[tuple[str, str, str]] = []  # (who, bootstrap, principal) in recovery's order

    def principal(client: Mapping[str, Any], who: str) -> str:
        try:
            return resolve_principal(client, who, given)
        except UnknownPrincipal as exc:
            name = who.split(" ", 1)[-1]
            raise UnknownPrincipal(
                f"{who}: eos cannot tell its principal: {exc}; give it with --principal {name}=User:NAME (or "
                "--principal User:NAME for every client)"
            ) from None

    for entry in config.sinks:
        if not isinstance(entry, KafkaSinkEntry):
            continue
        who = f"sink {entry.name}"
        kafka = entry.kafka
        prefix = ids.pool_id(entry.transactional_id_prefix or ids.default_prefix(config.name), entry.name, 0)[:-1]
        user = principal(kafka.client(), who)
        needs += sink_needs(who, kafka.bootstrap, user, kafka.topic, kafka.create_topic, prefix, ledger, exactly_once)
        sinks.append((who, kafka.bootstrap, user))
    for index, entry in enumerate(config.sources):
        if not isinstance(entry, KafkaSourceEntry):
            continue
        kafka = entry.kafka
        who = f"source {entry.name}"
        user = principal(kafka.client(), who)
        group = f"eos-{config.name}.{entry.name}"  # source.KafkaSource.group_id
        needs += source_needs(who, kafka.bootstrap, user, config.name, kafka.topics, group)
        if index == 0 and exactly_once:
            needs += control_needs(kafka.bootstrap, user, f"{ledger}.control", ids.driver_id(config.name))
        if entry.on_error == "dlq" and entry.dlq_topic:
            dlq = f"{entry.name}.dlq"
            prefix = ids.pool_id(ids.default_prefix(config.name), dlq, 0)[:-1]
            who = f"dead-letter queue {dlq}"
            needs += sink_needs(who, kafka.bootstrap, user, entry.dlq_topic, True, prefix, ledger, exactly_once)
            sinks.append((who, kafka.bootstrap, user))
    if exactly_once:
        needs += recovery_needs(sinks, ledger)
    return needs


def recovery_needs(sinks: list[tuple[str, str, str]], ledger: str) -> list[Need]:
    """Recovery (eos.protocol.recovery) reads the ledger of a cluster through its first Kafka sink
    (KafkaSink.read_ledger), and reset deletes the ledger through each sink in turn: the first that
    may wins (KafkaSink.forget). (Each pool is fenced with its own sink's client: sink_needs.)"""
    out: list[Need] = []
    first: dict[str, tuple[str, str]] = {}
    for who, bootstrap, principal in sinks:
        first.setdefault(bootstrap, (who, principal))
    for bootstrap, (who, principal) in first.items():

        def need(op: str, resource: str, name: str, command: str, why: str) -> Need:
            return Need(Acl(bootstrap, principal, resource, name, LITERAL, op), command, why, who)  # noqa: B023

        out += [
            need("Read", TOPIC, ledger, RUN, "recovery reads the ledger through the cluster's first Kafka sink"),
            need("Describe", GROUP, UNUSED_GROUP, RUN, WHY_UNUSED),
            need("Delete", TOPIC, ledger, RESET, "reset deletes the ledger topic (KafkaSink.forget)"),
        ]
    return out


def merge(needs: Iterable[Need], commands: Iterable[str] = COMMANDS) -> list[Entry]:
    """One entry per ACL, for the commands asked. A Describe (DescribeConfigs) is folded into an
    entry of the same resource that implies it and is needed unconditionally: granting both
    would list one ACL twice."""
    wanted = set(commands)
    own: dict[Acl, list[Need]] = {}
    for need in needs:
        if need.command in wanted:
            own.setdefault(need.acl, []).append(need)
    entries = {acl: _entry(acl, uses) for acl, uses in own.items()}
    for acl, uses in own.items():
        stronger = _implying(entries, acl)
        if stronger is not None:
            for need in uses:
                _add(stronger, need, folded=acl.operation)
            del entries[acl]
    return sorted(entries.values(), key=lambda e: e.acl)


def _entry(acl: Acl, uses: list[Need]) -> Entry:
    entry = Entry(acl, optional=all(n.optional for n in uses))
    conditions = {n.only_if for n in uses}
    entry.only_if = conditions.pop() if len(conditions) == 1 else None
    for need in uses:
        _add(entry, need)
    return entry


def _add(entry: Entry, need: Need, folded: str | None = None) -> None:
    """Record one use; uses with the same reason are one line naming their commands."""
    if need.command not in entry.commands:
        entry.commands.append(need.command)
        entry.commands.sort(key=COMMANDS.index)
    text = need.why + (f" ({folded}, which {entry.acl.operation} implies)" if folded else "")
    for index, line in enumerate(entry.why):
        commands, _, known = line.partition(": ")
        if known == text:
            merged = sorted({*commands.split(", "), need.command}, key=COMMANDS.index)
            entry.why[index] = f"{', '.join(merged)}: {text}"
            break
    else:
        entry.why.append(f"{need.command}: {text}")
    if need.client not in entry.clients:
        entry.clients.append(need.client)


def _implying(entries: dict[Acl, Entry], acl: Acl) -> Entry | None:
    for operation in IMPLIES.get(acl.operation, ()):
        entry = entries.get(Acl(acl.bootstrap, acl.principal, acl.resource, acl.name, acl.pattern, operation))
        if entry is not None and not entry.optional and entry.only_if is None:
            return entry
    return None


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def kafka_acls_command(acl: Acl, command_config: str = "admin.properties") -> str:
    """The `kafka-acls.sh` line that grants `acl` (run by an administrator)."""
    import shlex

    args = ["kafka-acls.sh", "--bootstrap-server", acl.bootstrap, "--command-config", command_config, "--add",
            "--allow-principal", acl.principal, "--operation", acl.operation]  # fmt: skip
    args += ["--cluster"] if acl.resource == CLUSTER else [f"--{acl.resource}", acl.name]
    if acl.pattern == PREFIXED:
        args += ["--resource-pattern-type", "prefixed"]
    return shlex.join(args)


def render(pipeline: str, entries: list[Entry], command_config: str = "admin.properties") -> list[str]:
    """The ACLs as commented kafka-acls.sh commands, grouped by cluster and principal."""
    lines = [
        f"# The Kafka ACLs pipeline {pipeline} needs ({len(entries)}), each with the calls that need it and the",
        "# commands that make them (run: eos run; status: eos status; reset: eos reset). Run them as a Kafka",
        f"# administrator: {command_config} holds the administrator's client settings. Read, Write and Delete",
        "# imply Describe; Create is needed only while its topic does not exist.",
    ]
    groups: dict[tuple[str, str], list[Entry]] = {}
    for entry in entries:
        groups.setdefault((entry.acl.bootstrap, entry.acl.principal), []).append(entry)
    for (bootstrap, principal), group in groups.items():
        clients = list(dict.fromkeys(c for e in group for c in e.clients))
        lines += ["", f"## {principal} at {bootstrap} ({', '.join(clients)})"]
        for entry in group:
            notes = [", ".join(entry.commands)]
            if entry.optional:
                notes.append("optional")
            if entry.only_if:
                notes.append(f"only if {entry.only_if}")
            lines.append(f"# {entry.acl.describe()} ({'; '.join(notes)})")
            lines += [f"#   {why}" for why in entry.why]
            lines.append(kafka_acls_command(entry.acl, command_config))
    return lines


def to_json(pipeline: str, entries: list[Entry]) -> str:
    return json.dumps({"pipeline": pipeline, "acls": [e.to_json() for e in entries]}, indent=2)

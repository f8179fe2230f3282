"""`eos status`: where a pipeline stands, read from its checkpoint and from Kafka, without
touching it. Works while the pipeline is stopped (and, read-only, while it runs).

- checkpoint: last logged and last committed epoch (Spark's offset and commit logs), whether an
  epoch waits to be replayed, whether a process holds the checkpoint now;
- ledger: the last epoch each (sink, slot) committed. Read with read_committed up to the last
  stable offset, WITHOUT fencing: fencing would abort a running pipeline's open transaction.
  An LSO below the high watermark means a transaction is open on the ledger topic (an epoch in
  flight, or a lingering one); entries beyond it are not visible yet, and status says so.
  `fence=True` fences every transactional id first (as recovery does), then reads it all;
- transactions: the state of the pipeline's transactional ids, from Kafka's own
  TransactionsCommand (kafka-tools, in the local broker's jar cache): confluent-kafka 2.16 has
  no ListTransactions / DescribeTransactions. Without Java or the jars this part says so;
  the LSO checks below still show whether anything is open;
- sink and ledger topics: partitions whose LSO is below the high watermark (open transactions
  pin them: every read_committed reader waits there), whoever owns them;
- source lag per partition: end offset (LSO for read_committed sources) minus the end offset of
  the last committed epoch in the checkpoint; the consumer group `eos-<pipeline>.<source>` is
  shown beside it (it is published one epoch late, for external lag monitors).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos.config import PipelineConfig
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos_connectors.kafka.clients import UnknownTopic, admin_client, describe_partitions, end_offsets
from eos_connectors.kafka.lag import committed_from_checkpoint, compute_lag, source_end_offsets
from eos_connectors.kafka.ledger import LedgerEntry, fence, read_ledger, scan_ledger

OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}
TOOLS_CLASS = "org.apache.kafka.tools.TransactionsCommand"


@dataclass
class Cluster:
    client: dict[str, Any]
    ids: list[str] = field(default_factory=list)  # transactional ids of the pipeline on it
    topics: list[str] = field(default_factory=list)  # sink (and DLQ) topics on it


def _clusters(config: PipelineConfig, slots: int) -> list[Cluster]:
    from eos.pipeline import sink_targets

    clusters: dict[str, Cluster] = {}
    for target in sink_targets(config).values():
        if target.topic is None:
            continue
        key = json.dumps(target.client, sort_keys=True)
        cluster = clusters.setdefault(key, Cluster(target.client))
        cluster.ids += [f"{target.transactional_prefix}-{slot}" for slot in range(slots)]
        cluster.topics.append(target.topic)
    return list(clusters.values())


# ---------------------------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------------------------


def _holder(checkpoint: Checkpoint) -> str | None:
    """Who holds the checkpoint's run lock ("pid N"), or None if nobody runs it. Probes with a
    shared lock, released at once, so a starting runner is never kept out for long."""
    path = checkpoint.meta_dir / "lock"
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 100).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def checkpoint_status(checkpoint: Checkpoint, meta: CheckpointMeta | None) -> dict[str, Any]:
    logged, committed = checkpoint.last_logged_epoch(), checkpoint.last_committed_epoch()
    committed_at = None
    if committed is not None:
        committed_at = (checkpoint.root / "commits" / str(committed)).stat().st_mtime
    return {
        "path": str(checkpoint.root),
        "exists": meta is not None,
        "checkpoint_id": meta.checkpoint_id if meta else None,
        "slots": meta.slots if meta else None,
        "mode": meta.mode if meta else None,
        "running": _holder(checkpoint),
        "last_logged_epoch": logged,
        "last_committed_epoch": committed,
        "last_committed_at": committed_at,
        "pending_replay": logged if logged is not None and (committed is None or committed < logged) else None,
    }


# ---------------------------------------------------------------------------------------------
# Ledger, without fencing
# ---------------------------------------------------------------------------------------------


def stable_and_high(client: dict[str, Any], topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark)."""
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    high = end_offsets(admin, partitions, read_committed=False)
    stable = end_offsets(admin, partitions, read_committed=True)
    return {p: (stable[(t, p)], high[(t, p)]) for (t, p) in high}


def read_ledger_unfenced(client: dict[str, Any], topic: str, pipeline: str) -> dict[tuple[str, int], LedgerEntry]:
    """The latest committed entry per (sink, slot), read up to the LSO (never waits on an open
    transaction; whatever is behind one is not visible yet)."""
    offsets = stable_and_high(client, topic)
    return scan_ledger(client, topic, pipeline, {p: stable for p, (stable, _) in offsets.items()}, strict=False)


def ledger_status(
    config: PipelineConfig, clusters: list[Cluster], checkpoint_id: str | None, fence_first: bool
) -> dict[str, Any]:
    topic = config.ledger_topic
    rows: list[dict[str, Any]] = []
    open_partitions: list[dict[str, Any]] = []
    missing = False
    for cluster in clusters:
        try:
            if fence_first:
                fence(cluster.client, cluster.ids)
                entries = read_ledger(cluster.client, topic, config.name, wait_s=30)
            else:
                entries = read_ledger_unfenced(cluster.client, topic, config.name)
            offsets = stable_and_high(cluster.client, topic)
        except UnknownTopic:
            missing = True
            continue
        for partition, (stable, high) in sorted(offsets.items()):
            if stable < high:
                open_partitions.append({"partition": partition, "stable": stable, "high": high})
        for (sink, slot), entry in sorted(entries.items()):
            rows.append({
                "sink": sink, "slot": slot, "epoch": entry.epoch, "records": entry.records,
                "attempt": entry.attempt, "written_at": entry.written_at or None,
                "this_checkpoint": checkpoint_id is None or entry.checkpoint == checkpoint_id,
            })  # fmt: skip
    return {"topic": topic, "exists": not missing, "fenced": fence_first, "entries": rows, "open": open_partitions}


# ---------------------------------------------------------------------------------------------
# Transactions (Kafka's TransactionsCommand)
# ---------------------------------------------------------------------------------------------


def tools_classpath() -> str | None:
    """The cached kafka jars (with kafka-tools), without fetching anything."""
    from eos_ops.localkafka import jar_cache_dir

    override = os.environ.get("EOS_KAFKA_TOOLS_CLASSPATH")
    if override:
        return override
    cache = jar_cache_dir()
    return str(cache / "libs" / "*") if (cache / ".complete").exists() else None


def _command_config(client: dict[str, Any]) -> str | None:
    """Java admin client properties for a secured cluster (librdkafka names mapped)."""
    props = {k: v for k, v in client.items() if k.startswith(("security.", "ssl.", "sasl."))}
    if not props:
        return None
    if "sasl.mechanisms" in props:
        props["sasl.mechanism"] = props.pop("sasl.mechanisms")
    user, password = props.pop("sasl.username", None), props.pop("sasl.password", None)
    if user is not None and "sasl.jaas.config" not in props:
        plain = props.get("sasl.mechanism", "PLAIN") == "PLAIN"
        module = "plain.PlainLoginModule" if plain else "scram.ScramLoginModule"
        props["sasl.jaas.config"] = (
            f'org.apache.kafka.common.security.{module} required username="{user}" password="{password}";'
        )
    handle, path = tempfile.mkstemp(prefix="eos-status-", suffix=".properties")
    with os.fdopen(handle, "w") as out:
        out.writelines(f"{k}={v}\n" for k, v in props.items())
    return path


def _table(text: str) -> list[dict[str, str]]:
    """TransactionsCommand prints a header row and tab-separated rows."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def _tool(classpath: str, client: dict[str, Any], *args: str, timeout: float = 60) -> str:
    from eos_ops.localkafka import find_java

    command = [find_java(), "-Xmx256m", "-cp", classpath, TOOLS_CLASS]
    command += ["--bootstrap-server", client["bootstrap.servers"]]
    config = _command_config(client)
    if config:
        command += ["--command-config", config]
    try:
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)
    finally:
        if config:
            os.unlink(config)
    if result.returncode != 0:
        raise RuntimeError((result.stderr or result.stdout).strip().splitlines()[-1] if result.stderr else "failed")
    return result.stdout


def transactions_status(clusters: list[Cluster], running: bool, epoch_timeout_s: float) -> dict[str, Any]:
    """The pipeline's open transactions; lingering = open while nothing runs the pipeline, or open
    longer than an epoch may take."""
    classpath = tools_classpath()
    ids = [i for c in clusters for i in c.ids]
    if classpath is None:
        return {"available": False, "reason": "the Kafka tools jars are not cached (run `eos kafka fetch`)",
                "ids": len(ids), "open": []}  # fmt: skip
    found: list[dict[str, Any]] = []
    try:
        for cluster in clusters:
            pattern = "|".join(re.escape(i) for i in cluster.ids)
            listed = _table(_tool(classpath, cluster.client, "list", "--transactional-id-pattern", f"^({pattern})$"))
            for row in listed:
                if row.get("TransactionState") not in OPEN_STATES or row.get("TransactionalId") not in cluster.ids:
                    continue
                described = _table(_tool(classpath, cluster.client, "describe", "--transactional-id",
                                         row["TransactionalId"]))  # fmt: skip
                detail = described[0] if described else {}
                duration_s = int(detail.get("TransactionDurationMs", "0") or 0) / 1000
                found.append({
                    "transactional_id": row["TransactionalId"],
                    "state": row["TransactionState"],
                    "producer_id": row.get("ProducerId"),
                    "open_s": duration_s,
                    "timeout_s": int(detail.get("TransactionTimeoutMs", "0") or 0) / 1000,
                    "partitions": detail.get("TopicPartitions", ""),
                    "lingering": not running or duration_s > epoch_timeout_s,
                })  # fmt: skip
    except Exception as exc:  # the tool is an aid: report, do not fail the whole status
        return {"available": False, "reason": f"TransactionsCommand failed: {exc}", "ids": len(ids), "open": found}
    return {"available": True, "ids": len(ids), "open": found}


# ---------------------------------------------------------------------------------------------
# Topics and lag
# ---------------------------------------------------------------------------------------------


def topics_status(clusters: list[Cluster]) -> list[dict[str, Any]]:
    rows = []
    for cluster in clusters:
        for topic in cluster.topics:
            try:
                offsets = stable_and_high(cluster.client, topic)
            except UnknownTopic:
                rows.append({"topic": topic, "exists": False, "open": []})
                continue
            pinned = [{"partition": p, "stable": s, "high": h} for p, (s, h) in sorted(offsets.items()) if s < h]
            rows.append({"topic": topic, "exists": True, "partitions": len(offsets), "open": pinned})
    return rows


def group_offsets(config: PipelineConfig) -> dict[tuple[str, str, int], int]:
    """(source, topic, partition) -> offset committed to the monitoring consumer group."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    out: dict[tuple[str, str, int], int] = {}
    for source in config.sources:
        group = f"{config.consumer_group}.{source.name}"
        admin = admin_client({"bootstrap.servers": source.kafka.bootstrap, **source.kafka.config})
        futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=15)
        for tp in futures[group].result().topic_partitions or []:
            if tp.offset >= 0:
                out[(source.name, tp.topic, tp.partition)] = tp.offset
    return out


def lag_status(config: PipelineConfig, checkpoint: Checkpoint, meta: CheckpointMeta | None) -> list[dict[str, Any]]:
    committed = committed_from_checkpoint(config, checkpoint, meta)
    rows = compute_lag(config, source_end_offsets(config), committed)
    try:
        groups = group_offsets(config)
    except Exception:  # monitoring aid only
        groups = {}
    return [{**r.as_dict(), "group": groups.get((r.source, r.topic, r.partition))} for r in rows]


# ---------------------------------------------------------------------------------------------
# All of it
# ---------------------------------------------------------------------------------------------


def gather(
    config: PipelineConfig, base_dir: Path | None, fence_first: bool = False, transactions: bool = True
) -> dict[str, Any]:
    checkpoint = Checkpoint(config.checkpoint_path(base_dir))
    meta = checkpoint.read_meta()
    point = checkpoint_status(checkpoint, meta)
    slots = meta.slots if meta else (config.epochs.slots or 0)
    clusters = _clusters(config, slots)
    report: dict[str, Any] = {
        "pipeline": config.name,
        "mode": config.epochs.mode,
        "slots": slots,
        "checked_at": time.time(),
        "checkpoint": point,
        "ledger": ledger_status(config, clusters, point["checkpoint_id"], fence_first),
        "sink_topics": topics_status(clusters),
        "lag": lag_status(config, checkpoint, meta),
    }
    if transactions:
        report["transactions"] = transactions_status(clusters, bool(point["running"]), config.epochs.timeout)
    return report


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------


def _ago(timestamp: float | None, now: float) -> str:
    if not timestamp:
        return "-"
    seconds = max(0.0, now - timestamp)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    if seconds < 120:
        return f"{when} ({seconds:.0f}s ago)"
    if seconds < 7200:
        return f"{when} ({seconds / 60:.0f}m ago)"
    return f"{when} ({seconds / 3600:.1f}h ago)"


def _table_lines(header: list[str], rows: list[list[Any]], indent: str = "  ") -> list[str]:
    cells = [header, *[["-" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [indent + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]


def render(report: dict[str, Any]) -> list[str]:
    now = report["checked_at"]
    point = report["checkpoint"]
    state = f"RUNNING ({point['running']})" if point["running"] else "stopped"
    lines = [f"pipeline {report['pipeline']}: {report['mode']}, {report['slots']} slots, {state}"]
    lines.append(f"checkpoint {point['path']}" + (f" (id {point['checkpoint_id']})" if point["exists"] else ""))
    if not point["exists"]:
        lines.append("  no eos checkpoint yet: the pipeline never started here")
    else:
        lines.append(
            f"  last logged epoch {point['last_logged_epoch']}, last committed epoch {point['last_committed_epoch']}"
            f" at {_ago(point['last_committed_at'], now)}"
        )
        if point["pending_replay"] is not None:
            lines.append(
                f"  epoch {point['pending_replay']} is logged but not marked committed: the next start replays it "
                "(slots the ledger shows as committed are skipped)"
            )

    ledger = report["ledger"]
    fenced = " (after fencing every transactional id)" if ledger["fenced"] else " (not fenced: read-only)"
    lines.append(f"ledger {ledger['topic']}{fenced}")
    if not ledger["exists"]:
        lines.append("  the ledger topic does not exist yet: nothing was ever committed")
    elif not ledger["entries"]:
        lines.append("  no entries for this pipeline")
    else:
        rows = [
            [e["sink"], e["slot"], e["epoch"], e["records"], e["attempt"], _ago(e["written_at"], now),
             "" if e["this_checkpoint"] else "OTHER CHECKPOINT"]
            for e in ledger["entries"]
        ]  # fmt: skip
        lines += _table_lines(["sink", "slot", "last committed epoch", "records", "attempt", "written", ""], rows)
        lines.append("  (a slot writes a ledger record only in epochs where it had records for that sink)")
    for part in ledger["open"]:
        lines.append(
            f"  OPEN TRANSACTION on partition {part['partition']}: last stable offset {part['stable']} < high "
            f"watermark {part['high']}; entries behind it are not visible yet"
        )

    txns = report.get("transactions")
    if txns is not None:
        if not txns["available"]:
            lines.append(f"transactions: not listed: {txns['reason']}")
        elif not txns["open"]:
            lines.append(f"transactions: none open among the pipeline's {txns['ids']} transactional ids")
        else:
            lines.append(f"transactions: {len(txns['open'])} open among the pipeline's {txns['ids']} transactional ids")
            rows = [
                [t["transactional_id"], t["state"], f"{t['open_s']:.0f}s", f"{t['timeout_s']:.0f}s",
                 "LINGERING" if t["lingering"] else "in flight", t["partitions"]]
                for t in txns["open"]
            ]  # fmt: skip
            lines += _table_lines(["transactional id", "state", "open for", "timeout", "", "partitions"], rows)
            if any(t["lingering"] for t in txns["open"]):
                lines.append(
                    "  a lingering transaction pins the last stable offset of its partitions (read_committed readers "
                    "wait) until the broker aborts it at its timeout, or the next start (or `eos status --fence`) "
                    "fences it"
                )

    for topic in report["sink_topics"]:
        if not topic["exists"]:
            lines.append(f"sink topic {topic['topic']}: does not exist")
        elif topic["open"]:
            parts = ", ".join(f"{p['partition']} (stable {p['stable']} < high {p['high']})" for p in topic["open"])
            lines.append(f"sink topic {topic['topic']}: open transactions pin partitions {parts}")
        else:
            lines.append(f"sink topic {topic['topic']}: {topic['partitions']} partitions, all stable")

    lag = report["lag"]
    basis = "last committed epoch's" if point["exists"] else "offset 0: never started, nothing resolved yet"
    lines.append(f"source lag: {sum(r['lag'] for r in lag):,} offsets behind (end offset - {basis})")
    if lag:
        rows = [[r["source"], r["topic"], r["partition"], r["end"], r["committed"], r["group"], r["lag"]] for r in lag]
        lines += _table_lines(["source", "topic", "partition", "end", "committed", "group", "lag"], rows)
    return lines

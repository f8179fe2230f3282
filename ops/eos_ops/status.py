"""`eos status`: where a pipeline stands, read from its checkpoint, its control log, its sinks and
its sources, without touching any of them. Works while the pipeline is stopped, and (read-only)
while it runs.

- checkpoint: last logged and last committed epoch (Spark's offset and commit logs) and whether
  an epoch waits to be replayed. A local checkpoint is read with plain file IO; any other
  (`hdfs://`, `s3a://`, ...) through Hadoop's FileSystem in a small JVM gateway started only then;
- control log: the driver that took the pipeline over last (host, pid, vote service address) and
  whether it answers a ping (then the pipeline runs), the last recorded commit decision, and the
  pools of transactional ids. Read up to the last stable offset, never fencing, never creating
  the topic;
- ledger: the last epoch each (sink, slot) committed. Kafka ledgers are read with read_committed
  up to the last stable offset, WITHOUT fencing (fencing would abort a running pipeline's open
  epoch): an open transaction on the ledger topic (an epoch in flight, or a lingering one) hides
  the entries behind it, and status says so;
- lingering transactions: what each sink reports open (`SinkConnector.lingering()`: for Kafka,
  sink and ledger topic partitions whose last stable offset is stuck below the high watermark),
  and for Kafka the state of every id of the pools from Kafka's own TransactionsCommand
  (kafka-tools, in the local broker's jar cache; confluent-kafka has no DescribeTransactions).
  Without Java or the jars that part says so; the stable-offset checks still show what is open;
- source lag per partition (`SourceConnector.lag()` against the last committed epoch's line), in
  offsets and in how long its oldest record not yet committed has waited.

`--fence` fences and resolves the way recovery does (eos.protocol.recovery: every id of every
recorded pool, then RESUME sinks resolved against the recorded decision), then reads the whole
ledger. It refuses while the pipeline's driver answers, unless forced: that would abort the
running pipeline's open epoch (it is retried).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from eos.config import PipelineConfig
from eos.declared import Connectors, connectors, pipeline_info
from eos.errors import CheckpointError, EosError
from eos.observe.lag import age, committed_lines, oldest_age, source_lag
from eos.protocol import recovery
from eos.protocol.channel import Liveness, ping
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta, is_local
from eos.protocol.decision import Decision, DriverInfo, Pool, decode
from eos.protocol.sink import SinkConnector
from eos.s3a import with_connector
from eos_ops.java_client import NoJavaEquivalent, write_command_config

OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}
TOOLS_CLASS = "org.apache.kafka.tools.TransactionsCommand"


# ---------------------------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------------------------


class JvmGateway:
    """A bare Spark JVM (py4j, no SparkContext) for Hadoop's FileSystem: what Checkpoint needs to
    read a non-local checkpoint. `spark.hadoop.*` settings of the pipeline file apply."""

    def __init__(self, conf: dict[str, str]):
        from pyspark import SparkConf
        from pyspark.java_gateway import launch_gateway

        from eos.sparksession import secret_settings

        spark_conf = SparkConf(loadDefaults=False)
        spark_conf.set("spark.driver.memory", "256m")
        # Handed to the JVM on its command line: never the secret ones (the spark.hadoop.* among
        # them are set on Hadoop's configuration below, inside the JVM).
        for key, value in secret_settings(conf)[0].items():
            spark_conf.set(key, value)
        # Under spark-submit this is the driver's own gateway: used, never shut down.
        self.owned = "PYSPARK_GATEWAY_PORT" not in os.environ
        self.gateway = launch_gateway(
            spark_conf, popen_kwargs={"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        )
        jvm = self.gateway.jvm
        hadoop = jvm.org.apache.hadoop.conf.Configuration()
        for key, value in conf.items():
            if key.startswith("spark.hadoop."):
                hadoop.set(key.removeprefix("spark.hadoop."), value)
        # What Checkpoint reads of a SparkSession.
        self.session = SimpleNamespace(_jvm=jvm, _jsc=SimpleNamespace(hadoopConfiguration=lambda: hadoop))

    def close(self) -> None:
        proc = getattr(self.gateway, "proc", None)
        if not self.owned or proc is None:
            with contextlib.suppress(Exception):
                self.gateway.close()
            return
        with contextlib.suppress(Exception):
            self.gateway.shutdown()
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the gateway server exits at the end of its stdin
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def open_checkpoint(config: PipelineConfig, base_dir: Path | None, jvm: bool | None = None) -> tuple[Checkpoint, Any]:
    """The checkpoint, and the JVM gateway opened for it (None for a local path, unless `jvm`)."""
    location = config.checkpoint_path(base_dir)
    if jvm is None:
        jvm = not is_local(location)
    if not jvm:
        return Checkpoint(location), None
    gateway = JvmGateway(with_connector({k: str(v) for k, v in config.spark.conf.items()}, location))
    try:
        if not is_local(location):
            return Checkpoint(location, gateway.session), gateway
        # Forced (tests): a local checkpoint read through Hadoop's local FileSystem, exactly as an
        # hdfs:// one would be (Checkpoint itself reads local paths with plain file IO).
        from eos.protocol.checkpoint import _HadoopFiles, local_path

        checkpoint = Checkpoint(location)
        session = gateway.session
        uri = local_path(location).as_uri()
        checkpoint.files = _HadoopFiles(uri, session._jvm, session._jsc.hadoopConfiguration())
        return checkpoint, gateway
    except Exception:
        gateway.close()
        raise


def _modified(checkpoint: Checkpoint, rel: str) -> float | None:
    try:
        if checkpoint.local is not None:
            return (checkpoint.local / rel).stat().st_mtime
        files: Any = checkpoint.files
        return files.fs.getFileStatus(files._path(rel)).getModificationTime() / 1000
    except Exception:
        return None


def checkpoint_status(checkpoint: Checkpoint, meta: CheckpointMeta | None, jvm: bool) -> dict[str, Any]:
    logged, committed = checkpoint.last_logged_epoch(), checkpoint.last_committed_epoch()
    return {
        "location": checkpoint.uri,
        "read_through": "a JVM gateway (Hadoop FileSystem)" if jvm else "local files",
        "exists": meta is not None,
        "checkpoint_id": meta.checkpoint_id if meta else None,
        "mode": meta.mode if meta else None,
        "parallelism": (meta.replay or {}).get("parallelism") if meta else None,
        "last_logged_epoch": logged,
        "last_committed_epoch": committed,
        "last_committed_at": _modified(checkpoint, f"commits/{committed}") if committed is not None else None,
        "pending_replay": checkpoint.pending_replay(),
    }


# ---------------------------------------------------------------------------------------------
# Control log (read-only)
# ---------------------------------------------------------------------------------------------


def _kafka_stable_and_high(client: dict[str, Any], topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark); raises UnknownTopic."""
    from eos_connectors.kafka.clients import admin_client, describe_topics, end_offsets

    admin = admin_client(client)
    partitions = {topic: describe_topics(admin, [topic])[topic].partitions}
    high = end_offsets(admin, partitions, read_committed=False)
    stable = end_offsets(admin, partitions, read_committed=True)
    return {p: (stable[(t, p)], high[(t, p)]) for (t, p) in high}


def read_control(found: Connectors) -> dict[str, Any]:
    """The control log's records as they are now: {"driver", "decision", "pools"} (typed), and
    where it lives; never waits on an open transaction, never creates the topic."""
    control = found.sources[0].control_log()
    try:
        from eos_connectors.kafka.control import KINDS, KafkaControlLog

        if isinstance(control, KafkaControlLog):
            from eos_connectors.kafka.clients import UnknownTopic
            from eos_connectors.kafka.ledger import control_key, scan

            out: dict[str, Any] = {"where": control.topic, "exists": True, "open": False}
            try:
                offsets = _kafka_stable_and_high(control.client, control.topic)
            except UnknownTopic:
                return {**out, "exists": False, "driver": None, "decision": None, "pools": {}}
            out["open"] = any(stable < high for stable, high in offsets.values())
            latest = scan(control.client, control.topic, {p: s for p, (s, _) in offsets.items()}, strict=False)
            records = {}
            for kind in KINDS:
                record = latest.get(control_key(control.pipeline, kind))
                if record is not None:
                    records[kind] = decode(record[1])[1]
            out["driver"] = DriverInfo(**records["driver"]) if "driver" in records else None
            out["decision"] = Decision(**records["decision"]) if "decision" in records else None
            pools = records.get("pools", {}).get("pools", {})
            out["pools"] = {name: Pool(**pool) for name, pool in pools.items()}
            return out
        # Another connector's control log: what its API tells (no pools).
        return {"where": type(control).__name__, "exists": True, "open": False,
                "driver": control.previous_driver(), "decision": control.decision(), "pools": {}}  # fmt: skip
    finally:
        control.close()


def _public(driver: DriverInfo) -> dict[str, Any]:
    """The recorded driver without its ping key (a secret: it would let anyone pose as that driver)."""
    return {k: v for k, v in asdict(driver).items() if k != "ping_key"}


def control_status(control: dict[str, Any]) -> dict[str, Any]:
    driver: DriverInfo | None = control.get("driver")
    # Only the recorded driver can prove it answers (another process may hold its port now).
    answers = driver is not None and ping(driver) is Liveness.ALIVE
    decision: Decision | None = control.get("decision")
    summary = None
    if decision is not None:
        summary = {
            "epoch": decision.epoch,
            "attempt": decision.attempt,
            "run": decision.run,
            "decided_at": decision.decided_at,
            "transactions": {sink: len(handles) for sink, handles in sorted(decision.prepared.items())},
        }
    pools = {name: {"size": p.size, "kind": p.kind, "system": p.system} for name, p in sorted(control["pools"].items())}
    return {
        "where": control["where"],
        "exists": control["exists"],
        "open_transaction": control["open"],
        "driver": {**_public(driver), "answers": answers} if driver is not None else None,
        "decision": summary,
        "pools": pools,
    }


# ---------------------------------------------------------------------------------------------
# Ledger, without fencing
# ---------------------------------------------------------------------------------------------


def _is_kafka(sink: SinkConnector) -> bool:
    try:
        from eos_connectors.kafka.sink import KafkaSink
    except ImportError:
        return False
    return isinstance(sink, KafkaSink)


def _entry_row(entry: Any, checkpoint_id: str | None) -> dict[str, Any]:
    return {
        "sink": entry.sink, "slot": entry.slot, "epoch": entry.epoch, "records": entry.records,
        "attempt": entry.attempt, "run": entry.run, "written_at": entry.written_at or None,
        "this_checkpoint": checkpoint_id is None or entry.checkpoint == checkpoint_id,
    }  # fmt: skip


def ledger_status(config: PipelineConfig, found: Connectors, checkpoint_id: str | None) -> list[dict[str, Any]]:
    """One section per ledger: Kafka ledger topics read up to their last stable offset; other
    sinks' ledgers through their connector's read_ledger."""
    sections: list[dict[str, Any]] = []
    kafka = [s for s in found.sinks if _is_kafka(s)]
    by_topic: dict[tuple[str, str], Any] = {}
    for sink in kafka:
        by_topic.setdefault((json.dumps(sink.client, sort_keys=True), sink.pipeline.ledger), sink)  # type: ignore[attr-defined]
    for (_, topic), sink in by_topic.items():
        section: dict[str, Any] = {"where": f"Kafka topic {topic}", "exists": True, "entries": [], "open": []}
        sections.append(section)
        try:
            from eos_connectors.kafka.clients import UnknownTopic
            from eos_connectors.kafka.ledger import entries, scan

            try:
                offsets = _kafka_stable_and_high(sink.client, topic)
            except UnknownTopic:
                section["exists"] = False
                continue
            latest = scan(sink.client, topic, {p: s for p, (s, _) in offsets.items()}, strict=False)
            found_entries = entries(latest, config.name, topic, strict=False)
        except Exception as exc:  # report, do not fail the whole status
            section["error"] = f"{type(exc).__name__}: {exc}"
            continue
        section["open"] = [{"partition": p, "stable": s, "high": h} for p, (s, h) in sorted(offsets.items()) if s < h]
        section["entries"] = [_entry_row(e, checkpoint_id) for _, e in sorted(found_entries.items())]
    others = [s for s in found.sinks if not _is_kafka(s)]
    for (kind, system), group in recovery.by_system(others).items():
        section = {"where": f"{kind.kind} ledger on {system}", "exists": True, "entries": [], "open": []}
        sections.append(section)
        try:
            section["entries"] = [_entry_row(e, checkpoint_id) for _, e in sorted(kind.read_ledger(group).items())]
        except Exception as exc:
            section["error"] = f"{type(exc).__name__}: {exc}"
    return sections


# ---------------------------------------------------------------------------------------------
# Lingering transactions
# ---------------------------------------------------------------------------------------------


def lingering_status(found: Connectors) -> list[dict[str, Any]]:
    rows = []
    for sink in found.sinks:
        try:
            rows.append({"sink": sink.name, "kind": sink.kind, "open": sink.lingering()})
        except Exception as exc:
            rows.append({"sink": sink.name, "kind": sink.kind, "open": [], "error": f"{type(exc).__name__}: {exc}"})
    return rows


def tools_classpath() -> str | None:
    """The cached kafka jars (with kafka-tools), without fetching anything."""
    from eos_ops.localkafka import jar_cache_dir

    override = os.environ.get("EOS_KAFKA_TOOLS_CLASSPATH")
    if override:
        return override
    cache = jar_cache_dir()
    return str(cache / "libs" / "*") if (cache / ".complete").exists() else None


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
    config = write_command_config(client)  # the client's security settings, as Java's (a 0600 file)
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


def kafka_pool_ids(found: Connectors, pools: dict[str, Pool]) -> list[tuple[dict[str, Any], list[str]]]:
    """(client settings, transactional ids) for every id of every recorded Kafka pool (sinks no
    longer configured included), each asked with the credentials of the sink it belongs to (sinks
    may write as different principals, and Kafka lists only the ids the asker may describe), plus
    the driver's own id with the control log's (the first source's). A pool whose sink is gone is
    asked with the first sink's on its cluster."""
    from eos_connectors.kafka import ids

    kafka = [s for s in found.sinks if _is_kafka(s)]
    if not kafka:
        return []
    systems: dict[str, Any] = {}
    for sink in kafka:
        try:
            systems.setdefault(sink.system(), sink)
        except Exception:
            continue
    by_name = {sink.name: sink for sink in kafka}
    out: dict[str, tuple[dict[str, Any], list[str]]] = {}

    def add(client: dict[str, Any], txids: list[str]) -> None:
        out.setdefault(json.dumps(client, sort_keys=True, default=str), (client, []))[1].extend(txids)

    for name, pool in sorted(pools.items()):
        if pool.kind != "kafka" or pool.system not in systems:
            continue
        sink = by_name.get(name) or systems[pool.system]
        prefix = pool.detail.get("prefix") or ids.default_prefix(kafka[0].pipeline.name)
        add(sink.client, [ids.pool_id(prefix, name, n) for n in range(pool.size)])
    control = found.sources[0].control_log() if found.sources else None
    client = getattr(control, "client", None) or kafka[0].client  # type: ignore[attr-defined]
    add(client, [ids.driver_id(kafka[0].pipeline.name)])
    return list(out.values())


def transactions_status(found: Connectors, pools: dict[str, Pool], running: bool, epoch_timeout_s: float) -> dict:
    """The Kafka pool ids' open transactions; lingering = open while no driver runs the pipeline,
    or open longer than an epoch may take."""
    clusters = kafka_pool_ids(found, pools)
    ids = [i for _, group in clusters for i in group]
    if not clusters:
        return {"available": False, "reason": "no Kafka sink", "ids": 0, "open": []}
    classpath = tools_classpath()
    if classpath is None:
        return {"available": False, "reason": "the Kafka tools jars are not cached (run `eos kafka fetch`)",
                "ids": len(ids), "open": []}  # fmt: skip
    found_open: list[dict[str, Any]] = []
    try:
        for client, group in clusters:
            pattern = "|".join(re.escape(i) for i in group)
            listed = _table(_tool(classpath, client, "list", "--transactional-id-pattern", f"^({pattern})$"))
            for row in listed:
                if row.get("TransactionState") not in OPEN_STATES or row.get("TransactionalId") not in group:
                    continue
                described = _table(_tool(classpath, client, "describe", "--transactional-id", row["TransactionalId"]))
                detail = described[0] if described else {}
                duration_s = int(detail.get("TransactionDurationMs", "0") or 0) / 1000
                found_open.append({
                    "transactional_id": row["TransactionalId"],
                    "state": row["TransactionState"],
                    "producer_id": row.get("ProducerId"),
                    "open_s": duration_s,
                    "timeout_s": int(detail.get("TransactionTimeoutMs", "0") or 0) / 1000,
                    "partitions": detail.get("TopicPartitions", ""),
                    "lingering": not running or duration_s > epoch_timeout_s,
                })  # fmt: skip
    except NoJavaEquivalent as exc:
        return {"available": False, "reason": f"Kafka's TransactionsCommand cannot be run: {exc}", "ids": len(ids),
                "open": found_open}  # fmt: skip
    except Exception as exc:  # the tool is an aid: report, do not fail the whole status
        return {"available": False, "reason": f"TransactionsCommand failed: {exc}", "ids": len(ids),
                "open": found_open}  # fmt: skip
    return {"available": True, "ids": len(ids), "open": found_open}


# ---------------------------------------------------------------------------------------------
# Lag
# ---------------------------------------------------------------------------------------------


def lag_status(found: Connectors, checkpoint: Checkpoint, meta: CheckpointMeta | None) -> dict[str, Any]:
    try:
        lines = committed_lines(checkpoint, found.sources, meta.sources if meta else None)
    except CheckpointError as exc:
        return {"rows": [], "error": exc.message}
    rows, errors = [], []
    for source, line in zip(found.sources, lines, strict=True):
        try:
            asked = source_lag([source], [line])
        except Exception as exc:
            errors.append(f"source {source.name}: {type(exc).__name__}: {exc}")
            continue
        now = time.time()
        # waited_s: how long the partition's oldest record not yet committed has waited (`oldest`:
        # its Kafka timestamp), when the source can tell.
        rows += [{**asdict(r), "lag": r.lag, "waited_s": oldest_age([r], now)} for r in asked]
    return {"rows": rows, "error": "; ".join(errors) or None}


# ---------------------------------------------------------------------------------------------
# Fencing (as recovery does)
# ---------------------------------------------------------------------------------------------


def fence(
    config: PipelineConfig, found: Connectors, checkpoint: Checkpoint, meta: CheckpointMeta | None, control: dict
) -> dict[str, Any]:
    """Fence every id of every recorded pool and resolve RESUME sinks against the recorded
    decision (eos.protocol.recovery), then read the ledgers as recovery does."""
    started = time.monotonic()
    checkpoint_id = meta.checkpoint_id if meta else ""
    timeout = max(60.0, config.epochs.timeout)
    try:
        report = recovery.recover(
            found.sinks, control["pools"], control["decision"], checkpoint, checkpoint_id, timeout, "eos status --fence"
        )
    except CheckpointError as exc:  # fenced and resolved; the ledger check refused: say so
        return {"fenced_ids": None, "resolved": {}, "seconds": time.monotonic() - started, "error": exc.message}
    return {"fenced_ids": report.fenced_ids, "resolved": report.resolved, "seconds": report.duration_s, "error": None}


# ---------------------------------------------------------------------------------------------
# All of it
# ---------------------------------------------------------------------------------------------


class StatusRefused(EosError):
    pass


def gather(
    config: PipelineConfig,
    base_dir: Path | None,
    fence_first: bool = False,
    transactions: bool = True,
    force: bool = False,
    jvm: bool | None = None,
) -> dict[str, Any]:
    checkpoint, gateway = open_checkpoint(config, base_dir, jvm)
    try:
        meta = checkpoint.read_meta()
        found = connectors(config, pipeline_info(config, meta.checkpoint_id if meta else "(none)", base_dir))
        try:
            report: dict[str, Any] = {
                "pipeline": config.name,
                "mode": config.epochs.mode,
                "checked_at": time.time(),
                "checkpoint": checkpoint_status(checkpoint, meta, gateway is not None),
            }
            try:
                control = read_control(found) if config.exactly_once else None
            except Exception as exc:
                control = None
                report["control"] = {"error": f"{type(exc).__name__}: {exc}"}
            if control is not None:
                report["control"] = control_status(control)
            driver = (report.get("control") or {}).get("driver")
            running = bool(driver and driver["answers"])
            report["running"] = running
            if fence_first:
                if running and not force:
                    raise StatusRefused(
                        f"the pipeline's driver answers (pid {driver['pid']} on {driver['host']}, vote service "
                        f"{driver['address']}): fencing now would abort its epoch in flight",
                        hint="stop the pipeline first, or add --force to fence anyway (its epoch is retried)",
                    )
                if control is None:
                    raise StatusRefused(f"cannot fence: the control log could not be read ({report['control']})")
                if not control["exists"]:
                    raise StatusRefused(
                        f"cannot fence: pipeline {config.name} has no control log ({control['where']}): it never ran "
                        "on this cluster, so no transactional id of it was ever used"
                    )
                report["fence"] = fence(config, found, checkpoint, meta, control)
            report["ledger"] = ledger_status(config, found, meta.checkpoint_id if meta else None)
            report["lingering"] = lingering_status(found)
            if transactions and control is not None:
                report["transactions"] = transactions_status(found, control["pools"], running, config.epochs.timeout)
            report["lag"] = lag_status(found, checkpoint, meta)
            return report
        finally:
            for connector in [*found.sources, *found.sinks]:
                with contextlib.suppress(Exception):
                    connector.close()
    finally:
        if gateway is not None:
            gateway.close()


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
    control = report.get("control") or {}
    driver = control.get("driver")
    state = f"RUNNING (driver pid {driver['pid']} on {driver['host']})" if report["running"] else "stopped"
    lines = [f"pipeline {report['pipeline']}: {report['mode']}, {state}"]
    lines.append(
        f"checkpoint {point['location']}" + (f" (id {point['checkpoint_id']})" if point["exists"] else "")
        + f", read through {point['read_through']}"
    )  # fmt: skip
    if not point["exists"]:
        lines.append("  no eos checkpoint yet: the pipeline never started here")
    else:
        lines.append(
            f"  last logged epoch {point['last_logged_epoch']}, last committed epoch {point['last_committed_epoch']}"
            f" at {_ago(point['last_committed_at'], now)}; {point['parallelism']} read tasks per epoch"
        )
        if point["pending_replay"] is not None:
            lines.append(
                f"  epoch {point['pending_replay']} is logged but not marked committed: the next start replays it "
                "(slots the ledger shows as committed are skipped)"
            )

    if "error" in control:
        lines.append(f"control log: cannot read it: {control['error']}")
    elif control:
        lines.append(f"control log {control['where']}" + ("" if control["exists"] else ": does not exist yet"))
        if driver is not None:
            answers = "answers: RUNNING" if driver["answers"] else "does not answer: not running"
            lines.append(
                f"  driver: pid {driver['pid']} on {driver['host']}, vote service {driver['address']} ({answers}), "
                f"took over {_ago(driver['started_at'], now)}, run {driver['run']}"
            )
        decision = control["decision"]
        if decision is not None:
            txns = ", ".join(f"{n} of {sink}" for sink, n in decision["transactions"].items()) or "none"
            lines.append(
                f"  last decision: epoch {decision['epoch']} attempt {decision['attempt']} commits {txns} "
                f"({_ago(decision['decided_at'], now)})"
            )
        if control["pools"]:
            pools = ", ".join(f"{name} {p['size']}" for name, p in control["pools"].items())
            lines.append(f"  pools of transactional ids: {pools}")
        if control["open_transaction"]:
            lines.append("  an open transaction on the control log (a driver recording right now?) hides newer records")

    fenced = report.get("fence")
    if fenced is not None:
        if fenced["error"]:
            lines.append(f"FENCED (as recovery does), then the ledger check refused: {fenced['error']}")
        else:
            resolved = ", ".join(f"{n} {what}" for what, n in fenced["resolved"].items()) or "nothing to resolve"
            lines.append(
                f"FENCED {fenced['fenced_ids']} transactional ids (as recovery does; {resolved}) in "
                f"{fenced['seconds']:.1f} s"
            )
    for section in report["ledger"]:
        how = " (after fencing)" if fenced is not None else " (not fenced: read-only, up to the last stable offset)"
        lines.append(f"ledger {section['where']}{how}")
        if section.get("error"):
            lines.append(f"  cannot read it: {section['error']}")
        elif not section["exists"]:
            lines.append("  does not exist yet: nothing was ever committed")
        elif not section["entries"]:
            lines.append("  no entries for this pipeline")
        else:
            rows = [
                [e["sink"], e["slot"], e["epoch"], e["records"], e["attempt"], _ago(e["written_at"], now),
                 "" if e["this_checkpoint"] else "OTHER CHECKPOINT"]
                for e in section["entries"]
            ]  # fmt: skip
            lines += _table_lines(["sink", "slot", "last committed epoch", "records", "attempt", "written", ""], rows)
            lines.append("  (a slot writes a ledger entry only in epochs where it had records for that sink)")
        for part in section["open"]:
            lines.append(
                f"  OPEN TRANSACTION on partition {part['partition']}: last stable offset {part['stable']} < high "
                f"watermark {part['high']}: it hides newer entries (an epoch in flight, or a lingering transaction)"
            )

    for row in report["lingering"]:
        if row.get("error"):
            lines.append(f"sink {row['sink']}: cannot tell what is open: {row['error']}")
        elif row["open"]:
            lines.append(f"sink {row['sink']}: LINGERING: {len(row['open'])} open")
            lines += [f"  {item}" for item in row["open"]]
        else:
            lines.append(f"sink {row['sink']}: nothing open")

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
    if any(row["open"] for row in report["lingering"] if row.get("kind") == "postgres"):
        lines.append(
            "  a prepared transaction holds its locks and keeps VACUUM from removing old rows until the next start (or "
            "`eos postgres cleanup`) resolves it; a STRANDED one only the role named (or a superuser) can resolve"
        )
    kafka_open = any(row["open"] for row in report["lingering"] if row.get("kind") != "postgres")
    if kafka_open or (txns and any(t["lingering"] for t in txns["open"])):
        lines.append(
            "  an open transaction pins the last stable offset of its partitions (read_committed readers wait) until "
            "the broker aborts it at its timeout, or the next start (or `eos status --fence`) fences it"
        )

    lag = report["lag"]
    basis = "the last committed epoch" if point["exists"] else "offset 0 (never started)"
    behind = sum(r["lag"] for r in lag["rows"])
    waited = [r["waited_s"] for r in lag["rows"] if r["lag"] and r.get("waited_s") is not None]
    oldest = f"; the oldest record not yet committed has waited {age(max(waited))}" if waited else ""
    lines.append(f"source lag: {behind:,} offsets behind {basis}{oldest}")
    if lag.get("error"):
        lines.append(f"  (incomplete: {lag['error']})")
    if lag["rows"]:
        rows = [
            [r["source"], r["topic"], r["partition"], r["end"], r["committed"], r["lag"],
             age(r.get("waited_s")) if r["lag"] else "-"]
            for r in lag["rows"]
        ]  # fmt: skip
        lines += _table_lines(["source", "topic", "partition", "end", "committed", "lag", "waited"], rows)
    return lines


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

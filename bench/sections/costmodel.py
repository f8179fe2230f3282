"""13. Cost model: how the protocol's costs grow with the cluster, and a model fitted to them.

Every other section runs 2 cores, 4 partitions and 2-4 slots. This one measures, on the real
broker and the real vote service, each cost against the number that drives it:
- recovery: fencing 16 to 1,024 transactional ids (eos_connectors.kafka.ledger.fence: the wire
  path, and the librdkafka producer per id it replaced), and reading the ledger of 1 to 1,024
  (slot, sink) entries;
- the driver's work per epoch (vote service, decision in the real control log, commits) against
  1 to 256 slots and 1 to 4 sinks, with synthetic slots in processes of their own speaking the real
  vote protocol (bench.sections.costmodel_slots); no Spark;
- the source's planning against 4 to 1,024 partitions: latestOffset (the admin requests), the
  barrier's shared ends, the read-task plan, and the size of the line Spark logs in the offset log.
Figures that the machine's load distorts least are the ones the model is fitted to: CPU seconds of
the driver's process (and of the broker's, read from /proc), requests and bytes; wall times are
medians over repeats, each row with the load average it was taken at. `fit` is a least-squares
line (fixed cost + cost per unit) with its residuals; `project` applies the lines to a 64-executor
cluster (256 slots, 4 sinks, 1,000 partitions). docs/SCALING.md is written from its output.

`python -m bench --sections costmodel --merge` (or --quick) runs it; on its own, with a broker:
`python -m bench.sections.costmodel BOOTSTRAP [--quick]` prints the figures and the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

QUICK_SIZES = {
    "fence_ids": (16, 128, 1024),
    "fence_reps": 2,
    "producer_ids": (16, 128),
    "ledger_entries": (4, 64, 1024),
    "ledger_history": 10,
    "slots": (1, 16, 64, 256),
    "sinks": (1, 4),
    "epochs": 4,
    "partitions": (4, 64, 1024),
    "plan_reps": 3,
}
FULL_SIZES = {
    "fence_ids": (16, 64, 256, 1024),
    "fence_reps": 5,
    "producer_ids": (16, 64, 256, 1024),
    "ledger_entries": (4, 64, 256, 1024),
    "ledger_history": 100,
    "slots": (1, 4, 16, 64, 128, 256),
    "sinks": (1, 2, 4),
    "epochs": 8,
    "partitions": (4, 16, 64, 256, 1024),
    "plan_reps": 7,
}
WORKERS = 4  # processes of synthetic slots


def load() -> float:
    return round(os.getloadavg()[0], 1)


def cpu_s() -> float:
    """CPU seconds of this process so far, every thread (the vote service's loop, librdkafka's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds of another process (the broker), from /proc; 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# ---------------------------------------------------------------------------------------------
# The model: least-squares lines, and their projection
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """y = fixed + per_unit * x, fitted to points; residuals in y's unit."""

    fixed: float
    per_unit: float
    residuals: tuple[float, ...]
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def at(self, x: float) -> float:
        return self.fixed + self.per_unit * x

    @property
    def r2(self) -> float:
        """The share of y's variance the line explains (1: every point on it)."""
        mean = sum(self.ys) / len(self.ys)
        total = sum((y - mean) ** 2 for y in self.ys)
        return 1.0 if total == 0 else 1.0 - sum(r * r for r in self.residuals) / total

    @property
    def worst(self) -> float:
        """The largest residual, in y's unit."""
        return max(abs(r) for r in self.residuals)

    @property
    def exponent(self) -> float | None:
        """k in y ~ x^k between the smallest and the largest x (1: linear; below: sublinear, a
        fixed cost dominates there; above: superlinear). None where a y is not positive."""
        points = sorted(zip(self.xs, self.ys, strict=True))
        (x0, y0), (x1, y1) = points[0], points[-1]
        if min(x0, y0, y1) <= 0 or x1 == x0:
            return None
        return math.log(y1 / y0) / math.log(x1 / x0)

    def to_dict(self) -> dict[str, Any]:
        return {"fixed": self.fixed, "per_unit": self.per_unit, "r2": self.r2, "worst": self.worst,
                "exponent": self.exponent, "residuals": list(self.residuals)}  # fmt: skip


def fit(xs: list[float], ys: list[float]) -> Line:
    """Least squares of y = a + b x. Points with one x only give a = mean y, b = 0."""
    if len(xs) != len(ys) or not xs:
        raise ValueError("fit needs as many x as y, at least one")
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = 0.0 if spread == 0 else sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    fixed = mean_y - slope * mean_x
    residuals = tuple(y - (fixed + slope * x) for x, y in zip(xs, ys, strict=True))
    return Line(fixed, slope, residuals, tuple(float(x) for x in xs), tuple(float(y) for y in ys))


# ---------------------------------------------------------------------------------------------
# 1. Recovery: fencing the pools, reading the ledger
# ---------------------------------------------------------------------------------------------


def fencing(
    bootstrap: str | dict[str, Any], broker_pid: int | None, sizes: tuple[int, ...], reps: int, path: str
) -> list[dict]:
    """Fence `n` ids that exist (recovery's case: they held transactions before), `reps` times each.
    path "wire": eos_connectors.kafka.fencer (what ledger.fence does now); "producers": a librdkafka
    producer per id, 16 at a time (what it did before, and still does for settings the wire path
    does not implement)."""
    from eos_connectors.kafka import fencer, ledger

    client = bootstrap if isinstance(bootstrap, dict) else {"bootstrap.servers": bootstrap}
    rows = []
    for n in sizes:
        txids = [f"bench-fence-{uuid.uuid4().hex[:8]}/out/{i}" for i in range(n)]
        ledger.fence(client, txids, 120)  # they exist now, as in a pool
        for rep in range(reps):
            cpu, broker, started = cpu_s(), process_cpu_s(broker_pid), time.perf_counter()
            requests = connections = 0
            if path == "wire":
                outcome = fencer.fence(client, txids, 120)
                requests, connections = outcome.requests, outcome.connections
            else:
                ledger._fence_with_producers(client, txids, 120)
                requests, connections = 8 * n, 3 * n  # counted in librdkafka's protocol debug log (SCALING.md)
            rows.append({
                "path": path, "ids": n, "rep": rep, "wall_s": time.perf_counter() - started,
                "driver_cpu_s": cpu_s() - cpu, "broker_cpu_s": process_cpu_s(broker_pid) - broker,
                "requests": requests, "connections": connections, "load": load(),
            })  # fmt: skip
    return rows


def secure_fencing(work: str, sizes: tuple[int, ...], reps: int, producer_ids: tuple[int, ...]) -> list[dict]:
    """fencing() on a secured local broker of its own (SASL_SSL, SCRAM-SHA-512, the broker's CA
    verified: what a production cluster asks of every connection), for a user allowed everything."""
    import secrets
    from pathlib import Path

    from eos_connectors.kafka.clients import admin_client
    from eos_ops import kafka_security
    from eos_ops.localkafka import LocalBroker, free_port

    broker = LocalBroker(port=free_port(), data_dir=Path(work) / "secure-broker", heap="512m", secure=True)
    broker.start()
    try:
        admin = admin_client(broker.client_settings())
        password = secrets.token_urlsafe(18)
        kafka_security.add_scram_user(admin, "bench-fencer", password)
        kafka_security.grant_all(admin, "User:bench-fencer")
        assert broker.security is not None
        client = kafka_security.user_settings(broker.bootstrap, broker.security.tls.ca_file, "bench-fencer", password)
        rows = fencing(client, broker.pid(), sizes, reps, "wire")
        rows += fencing(client, broker.pid(), producer_ids, 1, "producers")
        for row in rows:
            row["security"] = "SASL_SSL SCRAM-SHA-512"
        return rows
    finally:
        broker.stop()


def ledger_read(bootstrap: str, sizes: tuple[int, ...], reps: int, epochs: int = 3) -> list[dict]:
    """read_ledger (after fencing: wait until stable, scan, decode) of a ledger topic holding `n`
    (sink, slot) entries, each written `epochs` times: compaction cleans only closed segments, so
    recovery reads every entry written since the active segment began (up to `segment.ms`, 6 h,
    or `segment.bytes`)."""
    from eos.protocol.ledger import LedgerEntry
    from eos_connectors.kafka import ledger
    from eos_connectors.kafka.clients import admin_client, producer

    client = {"bootstrap.servers": bootstrap}
    rows = []
    for n in sizes:
        topic = f"bench-ledger-{uuid.uuid4().hex[:8]}"
        ledger.ensure_ledger_topic(client, topic, admin_client(client))
        writer = producer({**client, "linger.ms": 5})
        size = 0
        for epoch in range(epochs):
            for i in range(n):
                sink, slot = f"s{i % 4}", i // 4
                entry = LedgerEntry("bench", sink, slot, epoch, "c", "o" * 64, "c" * 64, 1, "r", 100, time.time())
                value = entry.to_json().encode()
                size += len(value)
                writer.produce(topic, value, ledger.entry_key("bench", sink, slot), partition=0)
                if i % 10_000 == 0:
                    writer.poll(0)
        writer.flush(120)
        for rep in range(reps):
            cpu, started = cpu_s(), time.perf_counter()
            found = ledger.read_ledger(client, topic, "bench")
            wall, cpu = time.perf_counter() - started, cpu_s() - cpu
            rows.append({"entries": n, "epochs": epochs, "rep": rep, "records": epochs * n, "bytes": size,
                         "found": len(found), "wall_s": wall, "driver_cpu_s": cpu, "load": load()})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------
# 2. The driver's work per epoch against slots and sinks
# ---------------------------------------------------------------------------------------------


class SlotWorkers:
    """WORKERS processes of synthetic slots (bench.sections.costmodel_slots)."""

    def __init__(self, count: int = WORKERS):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.sections.costmodel_slots"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(count)
        ]

    def start_epoch(self, address: Any, epoch: int, attempt: int, jobs: list[tuple[int, str]]) -> None:
        for index, proc in enumerate(self.procs):
            order = {"host": address.host, "port": address.port, "key": address.key, "epoch": epoch,
                     "attempt": attempt, "jobs": jobs[index :: len(self.procs)]}  # fmt: skip
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(order) + "\n")
            proc.stdin.flush()

    def finish_epoch(self) -> list[str]:
        failed: list[str] = []
        for proc in self.procs:
            assert proc.stdout is not None
            answer = json.loads(proc.stdout.readline() or '{"failed": ["worker exited"]}')
            failed += answer["failed"]
        return failed

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()


def driver_epochs(bootstrap: str, slots: int, sinks: int, epochs: int, workers: SlotWorkers) -> list[dict]:
    """`epochs` epochs of `slots` slots writing `sinks` sinks, the driver's side real: the vote
    service, EpochCommitter._decide (the decision in the Kafka control log) and ._commit (release,
    wait for every commit report). Per epoch: the driver process's CPU seconds (every thread) from
    opening the attempt to closing it, and the wall time of its phases."""
    from eos.protocol.committer import EpochCommitter
    from eos.protocol.coordinator import Coordinator
    from eos.protocol.decision import DriverInfo
    from eos.protocol.sink import PipelineInfo, Prepared, Recovery
    from eos_connectors.kafka.control import KafkaControlLog

    name = f"bench-cost-{uuid.uuid4().hex[:6]}"
    sink_names = [f"out{i}" for i in range(sinks)]
    control = KafkaControlLog({"bootstrap.servers": bootstrap}, f"eos-ledger-{name}.control", name)
    coordinator = Coordinator(slots=slots, identity={"pipeline": name, "run": "bench"})
    try:
        control.take_over(DriverInfo("bench", "localhost", os.getpid(), coordinator.address.hostport, pipeline=name))
        coordinator.set_pools({sink: slots for sink in sink_names})
        pipeline = PipelineInfo(name, "bench", True, 60.0, ledger=f"eos-ledger-{name}")
        stubs = [SimpleNamespace(name=sink, recovery=Recovery.REPLAY) for sink in sink_names]
        committer = EpochCommitter(None, pipeline, stubs, (), None, "digest", control, coordinator, {}, 0)  # type: ignore[arg-type]
        jobs = [(slot, sink) for slot in range(slots) for sink in sink_names]
        rows = []
        for epoch in range(epochs + 1):  # the first one warms up (connections, the control log's producer)
            plan = SimpleNamespace(epoch=epoch, attempt=1)
            cpu0, t0 = cpu_s(), time.perf_counter()
            state = coordinator.open_attempt(epoch, 1, 60.0)
            workers.start_epoch(coordinator.address, epoch, 1, jobs)
            with coordinator._lock:  # the job: every slot has voted (what the tasks' return means)
                coordinator._lock.wait_for(lambda state=state: len(state.votes) >= len(jobs), 60)
            cpu1, t1 = cpu_s(), time.perf_counter()
            votes = coordinator.votes(epoch, 1)
            prepared = [Prepared(v.sink, v.slot, v.handle, v.records, 0, {"lease": v.lease}) for v in votes]
            committer._decide(plan, prepared)  # type: ignore[arg-type]
            t2 = time.perf_counter()
            committer._commit(plan, prepared)  # type: ignore[arg-type]
            coordinator.close_attempt(epoch, 1, "finished")
            cpu3, t3 = cpu_s(), time.perf_counter()
            failed = workers.finish_epoch()
            if failed:
                raise RuntimeError(f"{slots} slots x {sinks} sinks, epoch {epoch}: {failed}")
            if epoch == 0:
                continue
            decision = committer.decision
            rows.append({
                "slots": slots, "sinks": sinks, "epoch": epoch, "transactions": len(prepared),
                "driver_cpu_s": cpu3 - cpu0, "vote_cpu_s": cpu1 - cpu0, "decide_commit_cpu_s": cpu3 - cpu1,
                "votes_s": t1 - t0, "decide_s": t2 - t1, "commit_s": t3 - t2,
                "decision_bytes": len(json.dumps(decision.__dict__)) if decision else 0,
                "requests": 3 * len(jobs), "load": load(),
            })  # fmt: skip
        return rows
    finally:
        coordinator.close()
        control.close()


def protocol(bootstrap: str, slot_sizes: tuple[int, ...], sink_sizes: tuple[int, ...], epochs: int) -> list[dict]:
    workers = SlotWorkers()
    try:
        rows = []
        for sinks in sink_sizes:
            for slots in slot_sizes:
                rows += driver_epochs(bootstrap, slots, sinks, epochs, workers)
        return rows
    finally:
        workers.close()


# ---------------------------------------------------------------------------------------------
# 3. The source's planning against partitions
# ---------------------------------------------------------------------------------------------


def planning(bootstrap: str, sizes: tuple[int, ...], reps: int, work: str) -> list[dict]:
    """For a topic of `n` partitions (a few records in each): the first scan's latestOffset (the
    topic's description and its last stable offsets, then the plan, published for the other scans:
    eos.protocol.barrier), a second scan taking those ends (and checking them), the read tasks
    (`partitions`: the even-share cut and the packing, for 2 and for 256 tasks), and the size of
    the line Spark writes for the source in its offset log (one per scan: the main and poison scans)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from eos.protocol.barrier import SharedEnds
    from eos_connectors.kafka.clients import admin_client, create_topic, describe_topics, producer
    from eos_connectors.kafka.reader import KafkaStreamReader, ReaderOptions

    client = {"bootstrap.servers": bootstrap}
    admin = admin_client(client)
    rows = []
    for n in sizes:
        topic = f"bench-plan-{n}-{uuid.uuid4().hex[:6]}"
        create_topic(admin, topic, n, 1)
        writer = producer({**client, "linger.ms": 5})
        for p in range(n):
            for _ in range(5):
                writer.produce(topic, b"x", partition=p)
        writer.flush(60)
        topic_id = describe_topics(admin, [topic])[topic].topic_id
        start = {topic: {str(p): 0 for p in range(n)}}
        for rep in range(reps):
            ends = SharedEnds(os.path.join(work, f"barrier-{topic}"), f"run-{rep}")

            options = ReaderOptions(
                name="in", client=client, topics=[topic], starting=start, topic_ids={topic: topic_id},
                parallelism=2, on_error="fail", shared_ends=ends,
            )  # fmt: skip
            first = KafkaStreamReader(options)
            second = KafkaStreamReader(dataclasses.replace(options, parallelism=256))
            # A round first, untimed: in a running query each scan's admin client is connected and
            # has seen the log's latest offsets once (the timed round then plans from the same start).
            first.latestOffset(start, ReadAllAvailable())
            second.latestOffset(start, ReadAllAvailable())
            for p in range(n):  # the log grew since: the second scan asks for the latest offsets to check the ends
                writer.produce(topic, b"x", partition=p)
            writer.flush(60)
            cpu, started = cpu_s(), time.perf_counter()
            end = first.latestOffset(start, ReadAllAvailable())
            plan_s, plan_cpu = time.perf_counter() - started, cpu_s() - cpu
            cpu, started = cpu_s(), time.perf_counter()
            taken = second.latestOffset(start, ReadAllAvailable())
            take_s, take_cpu = time.perf_counter() - started, cpu_s() - cpu
            assert taken == end
            cpu, started = cpu_s(), time.perf_counter()
            tasks_2 = first.partitions(start, end)
            split_2 = cpu_s() - cpu
            cpu = cpu_s()
            tasks_256 = second.partitions(start, end)
            split_256 = cpu_s() - cpu
            line = json.dumps(end, separators=(",", ":"))
            rows.append({
                "partitions": n, "rep": rep, "latest_offset_s": plan_s, "latest_offset_cpu_s": plan_cpu,
                "take_ends_s": take_s, "take_ends_cpu_s": take_cpu, "read_tasks_2_cpu_s": split_2,
                "read_tasks_256_cpu_s": split_256, "tasks": [len(tasks_2), len(tasks_256)],
                "offset_log_bytes": len(line), "offset_log_bytes_per_epoch": 2 * len(line), "load": load(),
            })  # fmt: skip
    return rows


def spark_planning(bench: Any, sizes: tuple[int, ...], events: int) -> list[dict]:
    """Spark's own planning of a real exactly-once query (local[2]) on topics of `n` partitions:
    one short run per size; per epoch, plan_s is latestOffset + getBatch + queryPlanning + walCommit
    (bench.sections.protocol). Medians over the run's epochs."""
    from bench import runs
    from bench.runs import EO, measure

    # The first query of a session plans slowly (JVM, Python workers): not the partitions' cost.
    # (bench.runs.warm_up(bench) where the bench has it there, else the Bench's own method.)
    warm_up = getattr(runs, "warm_up", None)
    warm_up(bench) if warm_up is not None else bench.warm_up()
    rows = []
    for n in sizes:
        source = bench.input(events, n)
        row = measure(bench, "stateless", EO, source, max(1_000, events // 4))
        epochs = [e for e in row["epochs"] if e.get("records_out", e.get("input_rows"))]
        rows.append({
            "partitions": n, "epochs": len(epochs),
            "plan_ms": 1000 * median([e["plan_s"] for e in epochs]),
            "trigger_ms": 1000 * median([e["trigger_s"] for e in epochs]),
            "mark_ms": 1000 * median([e["mark_s"] for e in epochs]), "load": load(),
        })  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

# What a 64-executor cluster looks like to the model: 4 cores each (one slot per core), sinks and
# partitions as the issue names them, and a pool per sink of slots + room for retried tasks.
CLUSTER = {"slots": 256, "sinks": 4, "partitions": 1_000, "pool_ids": 256 * 4 + 4 * 64}


def medians(rows: list[dict], by: tuple[str, ...], value: str) -> dict[tuple, float]:
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(float(row[value]))
    return {key: median(values) for key, values in sorted(groups.items())}


def model(results: dict[str, Any]) -> dict[str, Any]:
    """Lines fitted to the medians, and what they predict for CLUSTER."""
    lines: dict[str, Line] = {}
    wire = [r for r in results.get("fencing", []) if r["path"] == "wire"]
    producers = [r for r in results.get("fencing", []) if r["path"] == "producers"]
    for name, rows, value in (
        ("fence_wall_s_per_id (wire)", wire, "wall_s"),
        ("fence_driver_cpu_s_per_id (wire)", wire, "driver_cpu_s"),
        ("fence_broker_cpu_s_per_id (wire)", wire, "broker_cpu_s"),
        ("fence_wall_s_per_id (producers)", producers, "wall_s"),
        ("fence_driver_cpu_s_per_id (producers)", producers, "driver_cpu_s"),
        ("fence_broker_cpu_s_per_id (producers)", producers, "broker_cpu_s"),
    ):
        points = medians(rows, ("ids",), value)
        if len(points) >= 2:
            lines[name] = fit([k[0] for k in points], list(points.values()))
    history = results.get("ledger", []) + results.get("ledger_history", [])
    scanned = medians(history, ("records",), "wall_s")
    if len(scanned) >= 2:
        lines["ledger_read_s_per_record"] = fit([k[0] for k in scanned], list(scanned.values()))
    ledger_points = medians(results.get("ledger", []), ("entries",), "wall_s")
    if len(ledger_points) >= 2:
        lines["ledger_read_s_per_entry"] = fit([k[0] for k in ledger_points], list(ledger_points.values()))
    proto = results.get("protocol", [])
    for value in ("driver_cpu_s", "vote_cpu_s", "decide_commit_cpu_s", "decide_s", "commit_s"):
        points = medians(proto, ("slots", "sinks"), value)
        if len(points) >= 2:  # against transactions per epoch: slots x sinks
            lines[f"epoch_{value}_per_txn"] = fit([k[0] * k[1] for k in points], list(points.values()))
    planned = results.get("planning", [])
    for value in ("latest_offset_s", "latest_offset_cpu_s", "take_ends_s", "read_tasks_256_cpu_s", "offset_log_bytes"):
        points = medians(planned, ("partitions",), value)
        if len(points) >= 2:
            lines[f"plan_{value}_per_partition"] = fit([k[0] for k in points], list(points.values()))
    spark = results.get("spark_planning", [])
    if len(spark) >= 2:
        lines["spark_plan_ms_per_partition"] = fit([r["partitions"] for r in spark], [r["plan_ms"] for r in spark])
    return {"lines": {k: v.to_dict() for k, v in lines.items()}, "projection": project(lines)}


def project(lines: dict[str, Line]) -> dict[str, float]:
    """The fitted lines at CLUSTER's sizes (what is fitted only)."""
    c = CLUSTER
    txns = c["slots"] * c["sinks"]
    at = {
        "fence_s (wire)": ("fence_wall_s_per_id (wire)", c["pool_ids"]),
        "fence_s (producers)": ("fence_wall_s_per_id (producers)", c["pool_ids"]),
        "fence_driver_cpu_s (wire)": ("fence_driver_cpu_s_per_id (wire)", c["pool_ids"]),
        "fence_broker_cpu_s (wire)": ("fence_broker_cpu_s_per_id (wire)", c["pool_ids"]),
        "ledger_read_s": ("ledger_read_s_per_entry", txns),
        "epoch_driver_cpu_s": ("epoch_driver_cpu_s_per_txn", txns),
        "epoch_driver_cpu_s (1 sink)": ("epoch_driver_cpu_s_per_txn", c["slots"]),
        "epoch_decide_s": ("epoch_decide_s_per_txn", txns),
        "epoch_commit_s": ("epoch_commit_s_per_txn", txns),
        "latest_offset_s": ("plan_latest_offset_s_per_partition", c["partitions"]),
        "take_ends_s": ("plan_take_ends_s_per_partition", c["partitions"]),
        "read_tasks_cpu_s": ("plan_read_tasks_256_cpu_s_per_partition", c["partitions"]),
        "offset_log_bytes": ("plan_offset_log_bytes_per_partition", c["partitions"]),
        "spark_plan_ms": ("spark_plan_ms_per_partition", c["partitions"]),
    }
    return {name: lines[line].at(x) for name, (line, x) in at.items() if line in lines}


# ---------------------------------------------------------------------------------------------
# The section
# ---------------------------------------------------------------------------------------------


def measure_all(bootstrap: str, broker_pid: int | None, quick: bool, work: str, say: Any = print) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    results: dict[str, Any] = {"sizes": sizes, "cluster": CLUSTER, "load_at_start": load()}
    say(f"fencing {sizes['fence_ids']} ids (wire) ...")
    results["fencing"] = fencing(bootstrap, broker_pid, sizes["fence_ids"], sizes["fence_reps"], "wire")
    say(f"fencing {sizes['producer_ids']} ids (a producer per id) ...")
    results["fencing"] += fencing(bootstrap, broker_pid, sizes["producer_ids"], 2, "producers")
    if not quick:
        say("fencing on a secured broker (SASL_SSL, SCRAM-SHA-512) ...")
        results["fencing_secure"] = secure_fencing(work, (64, 256, 1024), 3, (64, 256))
    say(f"reading ledgers of {sizes['ledger_entries']} entries ...")
    results["ledger"] = ledger_read(bootstrap, sizes["ledger_entries"], sizes["fence_reps"])
    say(f"reading a ledger of 1,024 entries x {sizes['ledger_history']} epochs (the active segment's history) ...")
    results["ledger_history"] = ledger_read(bootstrap, (1024,), 2, sizes["ledger_history"])
    say(f"driver per epoch, {sizes['slots']} slots x {sizes['sinks']} sinks ...")
    results["protocol"] = protocol(bootstrap, sizes["slots"], sizes["sinks"], sizes["epochs"])
    say(f"planning {sizes['partitions']} partitions ...")
    results["planning"] = planning(bootstrap, sizes["partitions"], sizes["plan_reps"], work)
    return results


def run(bench: Any) -> dict[str, Any]:
    results = measure_all(bench.bootstrap, bench.broker_pid, bench.plan.quick, str(bench.work), bench.say)
    sizes = (4, 64) if bench.plan.quick else (4, 64, 256, 1024)
    bench.say(f"Spark's planning of a real query, {sizes} partitions ...")
    results["spark_planning"] = spark_planning(bench, sizes, 20_000)
    results["model"] = model(results)
    for line in render(results):
        bench.say(line)
    return results


def render(results: dict[str, Any]) -> list[str]:
    """The figures (medians, with the load they were taken at) and the model, as markdown."""
    out = [
        "### Recovery: fencing",
        "",
        "| path | ids | wall s | driver CPU s | broker CPU s | requests | connections | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (path, ids), wall in medians(results.get("fencing", []), ("path", "ids"), "wall_s").items():
        rows = [r for r in results["fencing"] if r["path"] == path and r["ids"] == ids]
        out.append(
            f"| {path} | {ids:,} | {wall:.3f} | {median([r['driver_cpu_s'] for r in rows]):.3f} | "
            f"{median([r['broker_cpu_s'] for r in rows]):.2f} | {rows[0]['requests']:,} | {rows[0]['connections']:,} | "
            f"{min(r['load'] for r in rows)}–{max(r['load'] for r in rows)} |"
        )
    for (path, ids), wall in medians(results.get("fencing_secure", []), ("path", "ids"), "wall_s").items():
        rows = [r for r in results["fencing_secure"] if r["path"] == path and r["ids"] == ids]
        out.append(
            f"| {path}, SASL_SSL | {ids:,} | {wall:.3f} | {median([r['driver_cpu_s'] for r in rows]):.3f} | "
            f"{median([r['broker_cpu_s'] for r in rows]):.2f} | {rows[0]['requests']:,} | {rows[0]['connections']:,} | "
            f"{min(r['load'] for r in rows)}–{max(r['load'] for r in rows)} |"
        )
    out += [
        "",
        "### Recovery: the ledger read",
        "",
        "| entries | records | bytes | wall s | driver CPU s | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (n,), wall in medians(results.get("ledger", []), ("entries",), "wall_s").items():
        rows = [r for r in results["ledger"] if r["entries"] == n]
        cpu = median([r["driver_cpu_s"] for r in rows])
        out.append(
            f"| {n:,} | {rows[0]['records']:,} | {rows[0]['bytes']:,} | {wall:.3f} | {cpu:.3f} | {rows[0]['load']} |"
        )
    for r in results.get("ledger_history", [])[:1]:
        rows = results["ledger_history"]
        wall, cpu = median([x["wall_s"] for x in rows]), median([x["driver_cpu_s"] for x in rows])
        out.append(
            f"| {r['entries']:,} × {r['epochs']} epochs | {r['records']:,} | {r['bytes']:,} | {wall:.3f} | {cpu:.3f} | "
            f"{r['load']} |"
        )
    out += [
        "",
        "### The driver per epoch",
        "",
        "| slots | sinks | transactions | driver CPU ms | of it votes | decide + commit | wall: decide ms | "
        "commit ms | decision bytes | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (slots, sinks), cpu in medians(results.get("protocol", []), ("slots", "sinks"), "driver_cpu_s").items():
        rows = [r for r in results["protocol"] if r["slots"] == slots and r["sinks"] == sinks]

        def ms(key: str, rows: list[dict] = rows) -> str:
            return f"{1000 * median([r[key] for r in rows]):.1f}"

        out.append(
            f"| {slots} | {sinks} | {slots * sinks:,} | {1000 * cpu:.1f} | {ms('vote_cpu_s')} | "
            f"{ms('decide_commit_cpu_s')} | {ms('decide_s')} | {ms('commit_s')} | {rows[0]['decision_bytes']:,} | "
            f"{min(r['load'] for r in rows)}–{max(r['load'] for r in rows)} |"
        )
    out += [
        "",
        "### Planning",
        "",
        "| partitions | latestOffset ms | its CPU ms | second scan takes the ends ms | read tasks (256) CPU ms | "
        "offset log line bytes | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (n,), wall in medians(results.get("planning", []), ("partitions",), "latest_offset_s").items():
        rows = [r for r in results["planning"] if r["partitions"] == n]

        def ms(key: str, rows: list[dict] = rows) -> str:
            return f"{1000 * median([r[key] for r in rows]):.1f}"

        out.append(
            f"| {n:,} | {1000 * wall:.1f} | {ms('latest_offset_cpu_s')} | {ms('take_ends_s')} | "
            f"{ms('read_tasks_256_cpu_s')} | {rows[0]['offset_log_bytes']:,} | {rows[0]['load']} |"
        )
    if results.get("spark_planning"):
        out += [
            "",
            "| partitions | Spark's planning ms per epoch | epoch ms | commit log ms | epochs | load |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results["spark_planning"]:
            out.append(
                f"| {r['partitions']:,} | {r['plan_ms']:.0f} | {r['trigger_ms']:.0f} | {r['mark_ms']:.0f} | "
                f"{r['epochs']} | {r['load']} |"
            )
    fitted = (results.get("model") or {}).get("lines", {})
    if fitted:
        out += [
            "",
            "### Fitted lines (y = fixed + per unit × x)",
            "",
            "| line | fixed | per unit | R² | largest residual | grows as x^k, k = |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, line in fitted.items():
            k = "–" if line["exponent"] is None else f"{line['exponent']:.2f}"
            fixed, per_unit, r2, worst = line["fixed"], line["per_unit"], line["r2"], line["worst"]
            out.append(f"| {name} | {fixed:.4g} | {per_unit:.4g} | {r2:.3f} | {worst:.3g} | {k} |")
        out += ["", f"### Projection to {CLUSTER}", ""]
        out += [f"- {k}: {v:.4g}" for k, v in results["model"]["projection"].items()]
    return out


def main(argv: list[str]) -> int:
    """python -m bench.sections.costmodel BOOTSTRAP [--broker-pid PID] [--quick] [--json FILE]"""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m bench.sections.costmodel", description=main.__doc__)
    parser.add_argument("bootstrap")
    parser.add_argument("--broker-pid", type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        results = measure_all(args.bootstrap, args.broker_pid, args.quick, work)
    results["model"] = model(results)
    print("\n".join(render(results)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

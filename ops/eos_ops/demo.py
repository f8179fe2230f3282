"""`eos demo`: the README's run command, end to end on the embedded broker and a local PostgreSQL.

1. start the local Kafka broker (or use $EOS_BOOTSTRAP with --external-kafka) and the local
   PostgreSQL server (or use $EOS_PG_DSN with --external-postgres), both under $EOS_HOME;
2. reset the demo's topics, table and checkpoint;
3. generate ad impressions and clicks, with duplicates (same event_id) and late events, and
   keep the ground truth: the counts per campaign per minute of the distinct events;
4. run examples/ad_attribution.yaml until it has consumed everything;
5. read the output topic with read_committed and the output table with a plain query, and
   compare each, window by window, to the ground truth.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, examples_dir, schemas_dir
from eos_connectors.kafka.clients import admin_client, create_topic, producer

INPUT_TOPIC = "ad-events"
OUTPUT_TOPIC = "campaign-counts"
OUTPUT_TABLE = "campaign_counts"
PIPELINE_NAME = "ad-attribution"
EVENT_SCHEMA = "ad_event.avsc"  # the input's values (Avro, as examples/ad_attribution.yaml reads them)
OUTPUT_SCHEMA = "campaign_counts.avsc"  # the output's values
BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: fixed, so a seed gives the same events
MINUTE_MS = 60_000


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class DemoTruth:
    """What the generator wrote, and the counts a correct pipeline must output."""

    events: int = 0
    records_written: int = 0
    duplicates: int = 0
    late: int = 0
    expected: dict[tuple[str, int], Counter[str]] = field(default_factory=dict)

    def expected_counts(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {k: (c["impression"], c["click"]) for k, c in self.expected.items()}


def generate_events(
    n: int, seed: int = 7, campaigns: int = 8, minutes: int = 10
) -> tuple[list[dict[str, Any]], DemoTruth]:
    """Events in the order they arrive: duplicates resent within 20 s, 5% late by up to 30 s,
    one heartbeat at the end whose event time closes every window."""
    rng = random.Random(seed)
    truth = DemoTruth(events=n)
    arrivals: list[tuple[float, int, dict[str, Any]]] = []
    span = minutes * MINUTE_MS
    for i in range(n):
        event_time = BASE_TIME_MS + (i * span) // n
        event = {
            "event_id": f"ev-{seed}-{i}",
            "event_type": "click" if rng.random() < 0.12 else "impression",
            "campaign_id": f"campaign-{rng.randrange(campaigns):02d}",
            "user_id": f"user-{rng.randrange(5000)}",
            "event_time": event_time,
        }
        key = (event["campaign_id"], event_time - event_time % MINUTE_MS)
        truth.expected.setdefault(key, Counter())[event["event_type"]] += 1
        arrival = event_time
        if rng.random() < 0.05:
            arrival += rng.uniform(5_000, 30_000)
            truth.late += 1
        arrivals.append((arrival, i, event))
        if rng.random() < 0.08:
            arrivals.append((event_time + rng.uniform(1_000, 20_000), i, dict(event)))
            truth.duplicates += 1
    heartbeat_time = BASE_TIME_MS + span + 3 * MINUTE_MS
    heartbeat = {"event_id": f"heartbeat-{seed}", "event_type": "heartbeat", "campaign_id": "-", "user_id": "-",
                 "event_time": heartbeat_time}  # fmt: skip
    arrivals.append((heartbeat_time, n, heartbeat))
    arrivals.sort(key=lambda a: (a[0], a[1]))
    events = [event for _, _, event in arrivals]
    truth.records_written = len(events)
    return events, truth


def avro_schema(name: str) -> Any:
    """A parsed schema from schemas/, read here with fastavro directly: the demo's producer and its
    check are independent of the pipeline's codec."""
    import fastavro

    return fastavro.parse_schema(json.loads((schemas_dir() / name).read_text()))


def to_avro_record(event: dict[str, Any], schema: Any) -> bytes:
    """One event as an Avro body (no registry header), event_time as timestamp-millis."""
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, {**event, "event_time": datetime.fromtimestamp(
        event["event_time"] / 1000, tz=timezone.utc)})  # fmt: skip
    return out.getvalue()


def write_events(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    schema = avro_schema(EVENT_SCHEMA)
    for event in events:
        while True:
            try:
                out.produce(topic, to_avro_record(event, schema), event["campaign_id"].encode())
                break
            except BufferError:
                out.poll(0.1)
    if out.flush(60):
        raise EnvironmentProblem(f"could not deliver the demo events to {topic} at {bootstrap}")


# ---------------------------------------------------------------------------------------------
# Checking the output
# ---------------------------------------------------------------------------------------------


@dataclass
class DemoCheck:
    windows_expected: int
    windows_seen: int
    duplicated_windows: list[tuple[str, int]]
    missing_windows: list[tuple[str, int]]
    unexpected_windows: list[tuple[str, int]]
    wrong_counts: list[tuple[tuple[str, int], tuple[int, int], tuple[int, int]]]
    aborted_records_seen: int

    @property
    def ok(self) -> bool:
        return not (self.duplicated_windows or self.missing_windows or self.unexpected_windows or self.wrong_counts)


def from_avro_record(value: bytes, schema: Any) -> dict[str, Any]:
    import fastavro

    return fastavro.schemaless_reader(io.BytesIO(value), schema)


def _compare(rows: list[dict[str, Any]], truth: DemoTruth, aborted: int) -> DemoCheck:
    """Output rows (campaign_id, window_start as a UTC datetime, impressions, clicks) against the
    ground truth, window by window."""
    seen: dict[tuple[str, int], tuple[int, int]] = {}
    duplicated: list[tuple[str, int]] = []
    for row in rows:
        key = (row["campaign_id"], int(row["window_start"].timestamp() * 1000))
        if key in seen:
            duplicated.append(key)
        seen[key] = (row["impressions"], row["clicks"])
    expected = truth.expected_counts()
    return DemoCheck(
        windows_expected=len(expected),
        windows_seen=len(seen),
        duplicated_windows=duplicated,
        missing_windows=sorted(set(expected) - set(seen)),
        unexpected_windows=sorted(set(seen) - set(expected)),
        wrong_counts=[(k, seen[k], expected[k]) for k in sorted(set(seen) & set(expected)) if seen[k] != expected[k]],
        aborted_records_seen=aborted,
    )


def check_output(bootstrap: str, topic: str, truth: DemoTruth) -> DemoCheck:
    from eos_ops.verify import read_topic

    committed = read_topic(bootstrap, topic, read_committed=True)
    everything = read_topic(bootstrap, topic, read_committed=False)
    schema = avro_schema(OUTPUT_SCHEMA)
    # window_start: timestamp-millis -> datetime (UTC)
    rows = [from_avro_record(record.value, schema) for record in committed]
    return _compare(rows, truth, len(everything) - len(committed))


def check_table(dsn: str, table: str, truth: DemoTruth) -> DemoCheck:
    """The table's rows, read with a plain query (no eos code), against the ground truth. Rows of
    prepared transactions that are not committed yet are invisible: `aborted_records_seen` counts
    the prepared transactions still waiting in the database instead (0 after a clean run)."""
    from eos_ops.verify import prepared_transactions, read_table

    rows = [row for _, row in read_table(dsn, table)]
    return _compare(rows, truth, prepared_transactions(dsn))


def print_check(check: DemoCheck, truth: DemoTruth, output: str = "output", first: bool = True) -> None:
    impressions = sum(c["impression"] for c in truth.expected.values())
    clicks = sum(c["click"] for c in truth.expected.values())
    if first:
        print(
            f"input:  {truth.records_written} records = {truth.events} distinct events ({impressions} impressions, "
            f"{clicks} clicks) + {truth.duplicates} duplicates + 1 heartbeat; {truth.late} events late"
        )
    print(f"{output}: {check.windows_seen} campaign-minute windows (expected {check.windows_expected})")
    for label, items in (
        ("duplicated windows", check.duplicated_windows),
        ("missing windows", check.missing_windows),
        ("unexpected windows", check.unexpected_windows),
        ("wrong counts (seen, expected)", check.wrong_counts),
    ):
        if items:
            print(f"  {label}: {len(items)}, e.g. {items[:3]}")
    verdict = "EXACTLY ONCE: every window matches the ground truth" if check.ok else "MISMATCH"
    print(f"check ({output}):  {verdict}")


# ---------------------------------------------------------------------------------------------
# The demo
# ---------------------------------------------------------------------------------------------


def reset_table(dsn: str, table: str, pipeline: str, ledger_table: str = "eos_ledger") -> None:
    """Drop the demo's table and forget the pipeline's ledger rows; first roll back the pipeline's
    prepared transactions (an earlier demo killed mid-epoch), whose locks would block the drop."""
    import psycopg
    from psycopg import sql

    from eos_connectors.postgres import ledger
    from eos_connectors.postgres.sink import prepared_xacts

    with psycopg.connect(dsn, autocommit=True) as conn:
        for xact in prepared_xacts(conn, pipeline):
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(xact.gid)))
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        ledger.delete_pipeline(conn, ledger_table, pipeline)


def reset_demo(bootstrap: str, checkpoint: str, ledger_topic: str, spark: Any = None) -> None:
    admin = admin_client({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in (INPUT_TOPIC, OUTPUT_TOPIC, ledger_topic) if t in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result()
        deadline = time.monotonic() + 60
        while set(doomed) & set(admin.list_topics(timeout=10).topics):
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"topics {doomed} were not deleted within 60 s")
            time.sleep(0.2)
    from eos.protocol.checkpoint import Checkpoint

    Checkpoint(checkpoint, spark).delete()  # local, or on HDFS (the compose cluster) through Spark's JVM
    for topic in (f"{ledger_topic}.control",):
        if topic in set(admin.list_topics(timeout=10).topics):
            for future in admin.delete_topics([topic], operation_timeout=30).values():
                future.result()


def start_postgres(port: int, external: bool) -> str:
    """The demo database's DSN: $EOS_PG_DSN (--external-postgres), or the local server's."""
    if external:
        dsn = os.environ.get("EOS_PG_DSN")
        if not dsn:
            raise EnvironmentProblem("--external-postgres needs EOS_PG_DSN (a libpq connection string)")
        return dsn
    from eos_ops.localpg import LocalPostgres

    server = LocalPostgres(port=port)
    server.start(progress=_say)
    return server.dsn


def run_demo(
    port: int = 9092,
    external_kafka: bool = False,
    master: str | None = None,
    events: int = 40_000,
    seed: int = 7,
    metrics_port: int | None = None,
    keep_running: bool = False,
    metrics_host: str | None = None,
    pg_port: int = 5432,
    external_postgres: bool = False,
) -> int:
    from eos.config import load_pipeline
    from eos.runner import RunOptions, run_config

    if external_kafka:
        bootstrap = os.environ.get("EOS_BOOTSTRAP")
        if not bootstrap:
            raise EnvironmentProblem("--external-kafka needs EOS_BOOTSTRAP (host:port,...)")
    else:
        from eos_ops.localkafka import LocalBroker

        bootstrap = LocalBroker(port=port).start(progress=_say).bootstrap
    dsn = start_postgres(pg_port, external_postgres)
    os.environ["EOS_PG_DSN"] = dsn
    os.environ["EOS_BOOTSTRAP"] = bootstrap
    os.environ.setdefault("EOS_CHECKPOINT_DIR", str(eos_home() / "demo" / "checkpoints"))
    pipeline_file = examples_dir() / "ad_attribution.yaml"
    config = load_pipeline(pipeline_file)
    checkpoint = config.checkpoint_path(pipeline_file.parent)
    spark = None
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        from eos.sparksession import build_spark

        spark = build_spark(f"eos-{config.name}", master=master, checkpoint=checkpoint)

    _say(f"Resetting the demo topics, table and checkpoint ({checkpoint}) ...")
    reset_demo(bootstrap, checkpoint, config.ledger_topic, spark)
    reset_table(dsn, OUTPUT_TABLE, config.name)
    create_topic(admin_client({"bootstrap.servers": bootstrap}), INPUT_TOPIC, 4)
    generated, truth = generate_events(events, seed)
    write_events(bootstrap, INPUT_TOPIC, generated)
    _say(
        f"Wrote {truth.records_written} ad events to {INPUT_TOPIC} ({truth.duplicates} duplicates, {truth.late} late)."
    )

    _say(f"Running {pipeline_file.name} until it has consumed everything (Spark {master or 'local[*]'}) ...")
    started = time.monotonic()
    options = RunOptions(
        master=master, trigger="available-now", metrics_port=metrics_port, metrics_host=metrics_host, spark=spark
    )
    result = run_config(config, pipeline_file.parent, options)
    _say(f"Pipeline done: {result.epochs_committed} epochs in {time.monotonic() - started:.1f} s.")

    check = check_output(bootstrap, OUTPUT_TOPIC, truth)
    print_check(check, truth, f"topic {OUTPUT_TOPIC}")
    table_check = check_table(dsn, OUTPUT_TABLE, truth)
    print_check(table_check, truth, f"table {OUTPUT_TABLE}", first=False)
    if table_check.aborted_records_seen:
        print(f"  {table_check.aborted_records_seen} prepared transactions still wait in the database")
    if keep_running:
        keep_generating_and_running(bootstrap, config, pipeline_file.parent, master, metrics_port, seed, metrics_host)
    return 0 if check.ok and table_check.ok else 1


def keep_generating_and_running(
    bootstrap: str, config, base_dir: Path, master: str | None, metrics_port: int | None, seed: int,
    metrics_host: str | None = None, rate: int = 200,
) -> None:  # fmt: skip
    """Live mode (the compose cluster's dashboards): new events at `rate` a second with the
    current time, and the pipeline on its own trigger, until SIGTERM or Ctrl-C."""
    import threading

    from eos.runner import RunOptions, run_config

    stop = threading.Event()

    def generate() -> None:
        rng = random.Random(seed + 1)
        n = 0
        while not stop.wait(1.0):
            now = int(time.time() * 1000)
            batch = []
            for _ in range(rate):
                n += 1
                event = {"event_id": f"live-{seed}-{n}", "event_type": "click" if rng.random() < 0.12 else "impression",
                         "campaign_id": f"campaign-{rng.randrange(8):02d}", "user_id": f"user-{rng.randrange(5000)}",
                         "event_time": now - rng.randrange(0, 20_000)}  # fmt: skip
                batch.append(event)
                if rng.random() < 0.08:
                    batch.append(dict(event))  # a duplicate the pipeline must drop
            write_events(bootstrap, INPUT_TOPIC, batch)

    _say(f"Live mode: {rate} events/s into {INPUT_TOPIC}; the pipeline runs until SIGTERM or Ctrl-C.")
    generator = threading.Thread(target=generate, name="eos-demo-generator", daemon=True)
    generator.start()
    try:
        run_config(config, base_dir, RunOptions(master=master, metrics_port=metrics_port, metrics_host=metrics_host))
    finally:
        stop.set()

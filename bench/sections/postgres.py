"""12. The PostgreSQL sink against a plain psycopg COPY loop.

The stateless pipeline's rows (decode, filter, project) into a PostgreSQL table instead of a topic:
eos exactly-once with a `postgres:` sink (append: COPY inside the slot's transaction, PREPARE
TRANSACTION, COMMIT PREPARED after the decision), against a plain Python loop on the same input:
confluent-kafka consumer (read_committed), fastavro decode, the same filter, psycopg `COPY ...
FROM STDIN` of each consumed batch and a COMMIT per batch of `epoch_records` input records (one
process, no Spark). Rows/s is rows written over wall time; both tables are counted afterwards.
A server is started for the section (eos_ops.localpg.LocalPostgres) under the work folder.
The section is skipped, saying so, when this checkout has no PostgreSQL sink.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

from bench.context import Bench
from bench.pipelines import run_eos, unique
from bench.procs import CpuMeter
from bench.runs import OURS, warm_up

COLUMNS = ("event_id", "campaign_id", "event_type", "event_time")


def available() -> bool:
    from eos import registry

    try:
        return "postgres" in registry.sink_kinds()
    except Exception:
        return False


def copy_loop(bootstrap: str, topic: str, dsn: str, table: str, batch: int, broker_pid: int | None) -> dict[str, Any]:
    """The baseline: Kafka -> decode -> filter -> COPY, one transaction per `batch` input records."""
    from datetime import datetime, timezone

    import psycopg
    from confluent_kafka import TopicPartition
    from fastavro import schemaless_reader

    from bench.rawloop import _parse
    from eos.paths import schemas_dir
    from eos_connectors.kafka.clients import admin_client, consumer, describe_partitions, end_offsets
    from eos_connectors.kafka.range_reader import FETCH_TUNING
    from eos_ops.demo import EVENT_SCHEMA

    meter = CpuMeter(os.getpid(), broker_pid)
    meter.start()
    started = time.monotonic()
    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    reader = consumer(
        {"bootstrap.servers": bootstrap},
        **{"group.id": unique("bench-copy"), "isolation.level": "read_committed", **FETCH_TUNING},
    )
    reader.assign([TopicPartition(topic, p, 0) for p in partitions[topic]])
    schema = _parse(str(schemas_dir() / EVENT_SCHEMA))
    remaining = {(topic, p) for p in partitions[topic] if ends[(topic, p)] > 0}
    rows_in = rows_out = transactions = 0
    sql = f'COPY "{table}" ({", ".join(COLUMNS)}) FROM STDIN'
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor()
        try:
            while remaining:
                # One COPY and one transaction per `batch` input records, like eos's epochs. (The
                # COPY must stay inside its `with`: a `cur.copy(sql).__enter__()` whose context
                # manager is dropped is closed at once, and the server sees the COPY aborted.)
                with cur.copy(sql) as copy:
                    pending = 0
                    while remaining and pending < batch:
                        for m in reader.consume(10_000, 0.5):
                            if m.error() is not None:
                                continue
                            r = schemaless_reader(io.BytesIO(m.value()), schema, None)
                            rows_in += 1
                            pending += 1
                            if m.offset() + 1 >= ends[(m.topic(), m.partition())]:
                                remaining.discard((m.topic(), m.partition()))
                            if r["event_type"] == "heartbeat" or r["campaign_id"] == "campaign-00":
                                continue
                            stamp = datetime.fromtimestamp(r["event_time"] / 1000, tz=timezone.utc)
                            copy.write_row((r["event_id"], r["campaign_id"], r["event_type"], stamp))
                            rows_out += 1
                conn.commit()
                transactions += 1
        finally:
            reader.close()
    wall = time.monotonic() - started
    return {"wall_s": wall, "records_in": rows_in, "rows": rows_out, "transactions": transactions, "cpu": meter.stop()}


def count_rows(dsn: str, table: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]


def run(bench: Bench) -> dict[str, Any]:
    if not available():
        bench.say("postgres: this checkout has no PostgreSQL sink (connectors/eos_connectors/postgres): skipped")
        return {"skipped": "no PostgreSQL sink in this checkout (`postgres:` sink section unknown)"}
    import psycopg

    from eos_ops.localpg import LocalPostgres, free_port

    plan = bench.plan
    warm_up(bench)
    source = bench.input(plan.events, plan.partitions)
    server = LocalPostgres(port=free_port(), data_dir=bench.work / "postgres")
    bench.say("postgres: starting a local PostgreSQL server ...")
    server.start(progress=bench.say)
    runs: dict[str, list[dict[str, Any]]] = {"eos": [], "copy": []}
    try:
        for round_no in range(plan.rounds):
            for config in ("eos", "copy") if round_no % 2 == 0 else ("copy", "eos"):
                table = unique("bench_views").replace("-", "_")
                bench.say(f"postgres: round {round_no + 1}/{plan.rounds}: {config} ...")
                if config == "copy":
                    with psycopg.connect(server.dsn) as conn:
                        conn.execute(
                            f'CREATE TABLE "{table}" (event_id text, campaign_id text, event_type text, '
                            "event_time timestamptz)"
                        )
                    row = copy_loop(
                        bench.bootstrap, source.topic, server.dsn, table, plan.epoch_records, bench.broker_pid
                    )
                else:
                    name = table.replace("_", "-")
                    config_ = bench.config("stateless", name, source.topic, "unused", epoch_records=plan.epoch_records)
                    config_["sinks"] = [
                        {"name": "out", "postgres": {"dsn": server.dsn, "table": table, "create_table": True}}
                    ]
                    eos_run = run_eos(bench.spark, config_, bench.work, bench.broker_pid)
                    row = {"wall_s": eos_run.wall_s, "epochs": eos_run.epochs, "cpu": eos_run.cpu}
                row.update(config=config, round=round_no, records_in=source.records)
                row["rows_counted"] = count_rows(server.dsn, table)
                row["rows_per_s"] = row["rows_counted"] / row["wall_s"]
                row["rps_wall"] = source.records / row["wall_s"]
                row["cpu_us_per_record"] = sum(row["cpu"].get(k, 0.0) for k in OURS) * 1e6 / source.records
                runs[config].append(row)
                bench.say(
                    f"postgres: {config}: {row['rows_per_s']:,.0f} rows/s ({row['rows_counted']:,} rows, "
                    f"wall {row['wall_s']:.1f}s, {row['cpu_us_per_record']:,.0f} µs CPU per input record)"
                )
    finally:
        server.remove()  # as root its cluster may be outside the work folder (eos_ops.localpg)
    return {"input": source.__dict__, "epoch_records": plan.epoch_records, "runs": runs}

"""13. The Delta Lake sink against Spark's own idempotent Delta write and a plain deltalake loop.

The stateless pipeline's rows (decode, filter, project) into a Delta table, in three ways on the
same input and broker, in paired rounds:

- **eos**: exactly-once with a `delta:` sink (append: each slot stages Parquet files, the driver
  commits one Delta version per epoch with an app transaction), on the benchmark's warm session;
- **Spark + delta-spark**: what a Spark user writes for an idempotent Delta sink: Spark's Kafka
  source, `from_avro`, the same SQL, and `foreachBatch` writing each micro-batch with
  `txnAppId`/`txnVersion` (Delta's app transaction: a replayed batch is skipped). No delta-spark
  build runs on PySpark 4.3.0, which eos uses, so it runs on PySpark 4.2.0 in the virtualenv the
  tests' Delta reader uses (tests/support_delta.py), as a process of its own with its own JVM,
  jars from bench/maven/delta-spark.xml. It warms up first, outside the measured span: the same
  query on the benchmark's warm-up input in WARM_BATCHES batches, into a table of its own. The span is from its start
  signal to its query's end, JVM start-up excluded, as eos's run is on a warm session;
- **deltalake loop**: one Python process, no Spark: a confluent-kafka consumer (read_committed),
  fastavro decode, the same filter, `write_deltalake` of each batch of `epoch_records` input
  records with an app transaction (batch number) in the commit, as Spark's write has.

eos's sink and the loop warm up on the same warm-up input first (discarded). Each writes
`epoch_records` input records per Delta version. Rows/s is rows written over the
measured span; the tables are counted afterwards (delta-rs for eos's and the loop's, Spark for
its own). CPU per input record is every process of the run (bench.procs.CpuMeter: the Spark
baseline's JVM and Python driver are children of this process), the benchmark's own idle Spark
JVM included in every row alike.

This file is also the Spark baseline's program: `python -P bench/sections/delta.py SPEC.json` in the
PySpark 4.2.0 virtualenv (nothing of eos or the benchmark is imported at the top for that).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.context import Bench

EOS, SPARK, LOOP = "eos", "spark", "deltalake"
CONFIGS = (EOS, SPARK, LOOP)
LABELS = {
    EOS: "eos exactly-once, delta sink",
    SPARK: "Spark + delta-spark, foreachBatch with txnAppId/txnVersion (PySpark 4.2)",
    LOOP: "deltalake loop (write_deltalake per batch, with txn)",
}
SQL_FILTER = "event_type <> 'heartbeat' AND campaign_id <> 'campaign-00'"
COLUMNS = ("event_id", "campaign_id", "event_type", "event_time")
POM = Path(__file__).resolve().parent.parent / "maven" / "delta-spark.xml"
WARM_BATCHES = 4  # the Spark baseline's warm-up: batches over the warm-up input


# ---------------------------------------------------------------------------------------------
# The Spark baseline's program (runs in the PySpark 4.2.0 virtualenv: stdlib and pyspark only)
# ---------------------------------------------------------------------------------------------


def spark_app(spec: dict[str, Any]) -> None:
    """Warm up, say ready, wait for "go" on stdin, run the streaming query, say what it did, then
    wait for stdin to close (so the bench measures CPU while every process is still alive)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.avro.functions import from_avro

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-delta-spark")
        .config("spark.jars", ",".join(spec["jars"]))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        # Delta rebuilds the table's snapshot with a Spark job of 50 partitions by default: on 2
        # cores and a small log, 2 (one per core) is what a user tuning this job would set
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = Path(spec["schema"]).read_text()
    kafka = {"kafka.bootstrap.servers": spec["bootstrap"], "kafka.isolation.level": "read_committed"}

    def stream(topic: str, table: str, checkpoint: str, app_id: str, batch: int) -> tuple[int, dict[str, float]]:
        """The pipeline as a Spark user writes it, to its end (available-now); returns its batches
        and the seconds of each of Spark's phases over them (its progress reports' durationMs)."""
        raw = spark.readStream.format("kafka").options(**kafka).option("subscribe", topic)
        raw = raw.option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", batch).load()
        decoded = raw.select(from_avro("value", schema).alias("e")).select("e.*").where(SQL_FILTER)
        views = decoded.selectExpr("event_id", "campaign_id", "CAST(event_type AS STRING) AS event_type", "event_time")
        batches = []

        def write(batch: Any, batch_id: int) -> None:  # Delta's app transaction: a replayed batch is skipped
            options = {"txnAppId": app_id, "txnVersion": batch_id}
            batch.write.format("delta").mode("append").options(**options).save(table)
            batches.append(batch_id)

        query = views.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
        started = query.trigger(availableNow=True).start()
        started.awaitTermination()
        phases: dict[str, float] = {}
        for progress in started.recentProgress:
            for phase, ms in (progress.durationMs or {}).items():
                phases[phase] = phases.get(phase, 0.0) + ms / 1000
        return len(batches), phases

    # Several batches, so that the JIT has compiled the write path by the measured run
    warm_batch = max(1, spec["warm_records"] // WARM_BATCHES)
    stream(spec["warm_topic"], spec["warm_table"], spec["warm_checkpoint"], spec["app_id"] + "-warm", warm_batch)
    print(json.dumps({"ready": spark.version}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    started = time.monotonic()
    batches, phases = stream(spec["topic"], spec["table"], spec["checkpoint"], spec["app_id"], spec["epoch_records"])
    wall = time.monotonic() - started
    rows = spark.read.format("delta").load(spec["table"]).count()
    print(json.dumps({"wall_s": wall, "batches": batches, "rows": rows, "phases_s": phases}), flush=True)
    sys.stdin.read()  # until the bench has stopped its CPU meter
    spark.stop()


# ---------------------------------------------------------------------------------------------
# The three configurations (in the benchmark's process)
# ---------------------------------------------------------------------------------------------


def _shipped(python: Path) -> set[str]:
    """Artifact names of the jars the PySpark next to `python` ships."""
    from bench.connector import _artifact

    return {_artifact(jar.name) for jar in python.parent.parent.glob("lib/python*/site-packages/pyspark/jars/*.jar")}


def spark_jars(python: Path, say: Any) -> list[str]:
    from bench.connector import MAVEN_DIR, _artifact
    from eos.paths import eos_home
    from eos_ops.jvm import fetch_jars

    libs = fetch_jars(POM, eos_home() / "bench" / "delta-spark", "delta-spark baseline", say,
                      settings=MAVEN_DIR / "settings.xml")  # fmt: skip
    shipped = _shipped(python)
    return sorted(str(jar) for jar in libs.glob("*.jar") if _artifact(jar.name) not in shipped)


def run_spark(bench: Bench, python: Path, jars: list[str], source: Any, warm: Any, name: str) -> dict[str, Any]:
    import subprocess

    from bench.procs import CpuMeter
    from eos.paths import schemas_dir
    from eos_ops.demo import EVENT_SCHEMA

    folder = bench.work / "delta" / name
    spec = {
        "jars": jars, "bootstrap": bench.bootstrap, "schema": str(schemas_dir() / EVENT_SCHEMA),
        "epoch_records": bench.plan.epoch_records, "app_id": name,
        "warm_topic": warm.topic, "warm_records": warm.records, "warm_table": str(folder / "warm"),
        "warm_checkpoint": str(folder / "warm-ck"),
        "topic": source.topic, "table": str(folder / "table"), "checkpoint": str(folder / "ck"),
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_", "PYTHON"))}
    with open(folder / "stderr.log", "w") as log:
        process = subprocess.Popen(
            # -P: not this file's folder on sys.path (its profile.py would shadow the standard one)
            [str(python), "-P", __file__, str(folder / "spec.json")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env=env, cwd=folder,
        )  # fmt: skip
        assert process.stdin is not None and process.stdout is not None
        try:
            ready = _answer(process, folder)
            bench.say(f"delta: Spark {ready['ready']} warmed up; measuring ...")
            meter = CpuMeter(os.getpid(), bench.broker_pid)
            meter.start()
            process.stdin.write("go\n")
            process.stdin.flush()
            done = _answer(process, folder)
            cpu = meter.stop()
            process.stdin.close()
            process.wait(120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {"wall_s": done["wall_s"], "versions": done["batches"], "rows_counted": done["rows"], "cpu": cpu,
            "spark_phases_s": {k: round(v, 2) for k, v in done["phases_s"].items()}}  # fmt: skip


def _answer(process: Any, folder: Path) -> dict[str, Any]:
    for line in process.stdout:
        if line.startswith("{"):
            return json.loads(line)
    tail = (folder / "stderr.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"the Spark Delta baseline exited ({process.wait()}):\n{tail}")


def run_loop(bench: Bench, source: Any, table: Path, app_id: str) -> dict[str, Any]:
    """The baseline without Spark: consume, decode, filter, write_deltalake per batch (with txn)."""
    import io

    import pyarrow as pa
    from confluent_kafka import TopicPartition
    from deltalake import CommitProperties, Transaction, write_deltalake
    from fastavro import schemaless_reader

    from bench.pipelines import unique
    from bench.procs import CpuMeter
    from bench.rawloop import _parse
    from eos.paths import schemas_dir
    from eos_connectors.kafka.clients import admin_client, consumer, describe_partitions, end_offsets
    from eos_connectors.kafka.range_reader import FETCH_TUNING
    from eos_ops.demo import EVENT_SCHEMA

    schema = pa.schema([("event_id", pa.string()), ("campaign_id", pa.string()), ("event_type", pa.string()),
                        ("event_time", pa.timestamp("us", tz="UTC"))])  # fmt: skip
    meter = CpuMeter(os.getpid(), bench.broker_pid)
    meter.start()
    started = time.monotonic()
    admin = admin_client({"bootstrap.servers": bench.bootstrap})
    partitions = describe_partitions(admin, [source.topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    reader = consumer(
        {"bootstrap.servers": bench.bootstrap},
        **{"group.id": unique("bench-delta"), "isolation.level": "read_committed", **FETCH_TUNING},
    )
    reader.assign([TopicPartition(source.topic, p, 0) for p in partitions[source.topic]])
    avro = _parse(str(schemas_dir() / EVENT_SCHEMA))
    remaining = {(source.topic, p) for p in partitions[source.topic] if ends[(source.topic, p)] > 0}
    records = versions = 0
    try:
        while remaining:
            columns: dict[str, list[Any]] = {c: [] for c in COLUMNS}
            pending = 0
            while remaining and pending < bench.plan.epoch_records:
                for m in reader.consume(10_000, 0.5):
                    if m.error() is not None:
                        continue
                    r = schemaless_reader(io.BytesIO(m.value()), avro, None)
                    records += 1
                    pending += 1
                    if m.offset() + 1 >= ends[(m.topic(), m.partition())]:
                        remaining.discard((m.topic(), m.partition()))
                    if r["event_type"] == "heartbeat" or r["campaign_id"] == "campaign-00":
                        continue
                    for c in COLUMNS:
                        columns[c].append(r[c])
            batch = pa.table({**columns, "event_time": pa.array(columns["event_time"], pa.int64())})
            batch = batch.set_column(3, "event_time", batch.column("event_time").cast(pa.timestamp("ms", tz="UTC")))
            properties = CommitProperties(app_transactions=[Transaction(app_id, versions)])
            write_deltalake(str(table), batch.cast(schema), mode="append", commit_properties=properties)
            versions += 1
    finally:
        reader.close()
    wall = time.monotonic() - started
    return {"wall_s": wall, "records_in": records, "versions": versions, "cpu": meter.stop()}


def run_eos_sink(bench: Bench, source: Any, table: Path, name: str) -> dict[str, Any]:
    from bench.pipelines import run_eos

    config = bench.config("stateless", name, source.topic, "unused", epoch_records=bench.plan.epoch_records)
    config["sinks"] = [{"name": "out", "delta": {"table": str(table), "create_table": True}}]
    run = run_eos(bench.spark, config, bench.work, bench.broker_pid)
    return {"wall_s": run.wall_s, "versions": len(run.epochs), "cpu": run.cpu}


def count_rows(table: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).to_pyarrow_table(columns=["event_id"]).num_rows


def run(bench: Bench) -> dict[str, Any]:
    from bench.pipelines import unique
    from bench.runs import OURS, warm_up
    from tests.support_delta import spark42_python

    plan = bench.plan
    bench.say("delta: the PySpark 4.2.0 virtualenv and the delta-spark baseline's jars (made once) ...")
    python = spark42_python()
    jars = spark_jars(python, bench.say)
    warm_up(bench)
    warm = bench.input(plan.warmup_events, plan.partitions)
    for config in (EOS, LOOP):  # the Spark baseline warms up in its own process, on the same input
        bench.say(f"delta: warm-up: {LABELS[config]} on {warm.records:,} records (discarded)")
        name = unique(f"bench-delta-warm-{config}")
        table = bench.work / "delta" / name / "table"
        run_eos_sink(bench, warm, table, name) if config == EOS else run_loop(bench, warm, table, name)
    source = bench.input(plan.events, plan.partitions)
    runs: dict[str, list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    for round_no in range(plan.rounds):
        order = CONFIGS[round_no % 3 :] + CONFIGS[: round_no % 3]
        for config in order:
            name = unique(f"bench-delta-{config}")
            table = bench.work / "delta" / name / "table"
            bench.say(f"delta: round {round_no + 1}/{plan.rounds}: {LABELS[config]} ...")
            if config == EOS:
                row = run_eos_sink(bench, source, table, name)
                row["rows_counted"] = count_rows(table)
            elif config == LOOP:
                row = run_loop(bench, source, table, name)
                row["rows_counted"] = count_rows(table)
            else:
                row = run_spark(bench, python, jars, source, warm, name)
                bench.say(f"delta: Spark's phases (s, over its batches): {row['spark_phases_s']}")
            row.update(config=config, round=round_no, records_in=source.records)
            row["rows_per_s"] = row["rows_counted"] / row["wall_s"]
            row["rps_wall"] = source.records / row["wall_s"]
            row["cpu_us_per_record"] = sum(row["cpu"].get(k, 0.0) for k in OURS) * 1e6 / source.records
            runs[config].append(row)
            bench.say(
                f"delta: {config}: {row['rows_per_s']:,.0f} rows/s ({row['rows_counted']:,} rows in "
                f"{row['versions']} versions, {row['wall_s']:.1f}s, {row['cpu_us_per_record']:,.0f} µs CPU per "
                "input record)"
            )
    counts = {config: sorted({r["rows_counted"] for r in rows}) for config, rows in runs.items()}
    return {
        "input": source.__dict__,
        "epoch_records": plan.epoch_records,
        "runs": runs,
        "rows_agree": len({n for ns in counts.values() for n in ns}) == 1,
        "load_average": round(os.getloadavg()[0], 2),
    }


# ---------------------------------------------------------------------------------------------
# The report's text (bench/report registers it)
# ---------------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> list[str]:
    from bench.report.tables import cpu_cell, cpu_table, median_of, n, opening, ratio, span_of, table
    from bench.stats import paired_ratio

    section, out = opening(results, "delta", "14. Delta Lake sink against Spark's idempotent Delta write")
    if section is None:
        return out
    runs = section["runs"]
    out += [
        "The stateless pipeline's rows into a Delta table, on the same input and broker, in paired rounds: eos",
        "exactly-once with a `delta:` sink; Spark's Kafka source, `from_avro` and `foreachBatch` writing each batch",
        "with `txnAppId`/`txnVersion` (delta-spark 4.4.0 on PySpark **4.2.0**, in a process of its own: no",
        "delta-spark build runs on the PySpark 4.3.0 eos uses; warmed up, JVM start-up not measured); one Python",
        "process consuming with confluent-kafka and calling `write_deltalake` per batch with an app transaction.",
        f"Each writes a Delta version per {section['epoch_records']:,} input records. The Spark baseline and eos",
        "decode Avro differently (Spark's `from_avro` in the JVM, eos's fastavro in Python workers).",
        "",
    ]
    rows = []
    for config in CONFIGS:
        rs = runs.get(config, [])
        vs_eos = ratio(paired_ratio(runs, EOS, config, "rows_per_s")) if config != EOS else "–"
        rows.append([LABELS[config], span_of(rs, "rows_per_s"), cpu_cell(rs), n(median_of(rs, "rows_counted")),
                     n(median_of(rs, "versions")), vs_eos])  # fmt: skip
    out += table(["configuration", "rows/s", "CPU µs/input record", "rows", "Delta versions", "eos / this (paired)"],
                 rows)  # fmt: skip
    if not section.get("rows_agree"):
        out += ["**The three tables do not hold the same number of rows**: see the rows column.", ""]
    out += cpu_table({LABELS[c]: runs.get(c, []) for c in CONFIGS})
    return out


if __name__ == "__main__":
    spark_app(json.loads(Path(sys.argv[1]).read_text()))

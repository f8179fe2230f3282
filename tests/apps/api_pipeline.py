"""A pipeline built with the Python API on the user's own SparkSession, for tests that must run it
in a process of its own (a failpoint's kill -9 takes the process group):

    python tests/apps/api_pipeline.py BOOTSTRAP INPUT OUTPUT CHECKPOINT [--dsn DSN --table T] [--failpoint SPEC]

It upper-cases string records into a Kafka topic and, with --dsn, counts records per key into an
upserted PostgreSQL table, in the same epochs. Prints `committed N epochs` and exits 0 when the
input is drained.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import eos
from eos_connectors import kafka, postgres


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "output", "checkpoint"):
        parser.add_argument(name)
    parser.add_argument("--dsn")
    parser.add_argument("--table")
    parser.add_argument("--failpoint", action="append", default=[])
    args = parser.parse_args()

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("api-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    pipeline = eos.Pipeline(
        "api-" + args.output,
        checkpoint=args.checkpoint,
        spark=spark,
        epochs=eos.Epochs(
            trigger="available-now", slots=2, timeout="60s", output_mode="update" if args.dsn else "append"
        ),
        failpoints=args.failpoint,
    )
    events = pipeline.source(
        kafka.Source(
            "events", bootstrap=args.bootstrap, topics=[args.input], key_format="string", value_format="string",
            max_records_per_epoch=400,
        )
    )  # fmt: skip
    upper = events.select("key", F.upper("value").alias("value"))
    pipeline.sink(
        upper, kafka.Sink("out", bootstrap=args.bootstrap, topic=args.output, key="key", value="value",
                          value_format="string")
    )  # fmt: skip
    if args.dsn:
        counts = events.groupBy("key").agg(F.count("*").alias("n"))
        pipeline.sink(counts, postgres.Sink("counts", dsn=args.dsn, table=args.table, mode="upsert", key=["key"],
                                            create_table=True))  # fmt: skip
    query = pipeline.start()
    query.awaitTermination()
    print(f"committed {query.epochs_committed} epochs, {sum(query.records_out.values())} records out", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

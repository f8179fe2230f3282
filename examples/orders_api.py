"""examples/orders.yaml built with the Python API, inside a PySpark program of your own:
JSON orders -> paid orders summed per country -> a Kafka topic and a PostgreSQL table, exactly once.

    BROKERS=127.0.0.1:9092 PG_DSN="host=... dbname=... user=..." python examples/orders_api.py [--available-now]

docs/PYTHON_API.md explains every call.
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import eos
from eos_connectors import kafka, postgres


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--available-now", action="store_true", help="drain the input, then stop")
    parser.add_argument("--checkpoint", default="./checkpoints/orders-by-country-api")
    args = parser.parse_args()
    brokers = os.environ.get("BROKERS", "127.0.0.1:9092")

    spark = SparkSession.builder.appName("orders-by-country").getOrCreate()
    pipeline = eos.Pipeline(
        "orders-by-country-api",
        checkpoint=args.checkpoint,
        spark=spark,
        epochs=eos.Epochs(trigger="available-now" if args.available_now else "1s", output_mode="update"),
    )
    orders = pipeline.source(
        kafka.Source(
            "orders",
            bootstrap=brokers,
            topics=["orders"],
            value_format={"type": "json", "schema": "order_id STRING, country STRING, amount DOUBLE, status STRING"},
            on_error="dlq",
            dlq_topic="orders-dlq-api",
        )
    )
    paid = (
        orders.where(F.col("status") == "paid")
        .groupBy("country")
        .agg(F.sum("amount").alias("total"), F.count("*").alias("orders"))
    )
    pipeline.sink(paid, kafka.Sink("totals", bootstrap=brokers, topic="totals-by-country-api", key="country",
                                   create_topic=True))  # fmt: skip
    pipeline.sink(
        paid,
        postgres.Sink("totals_pg", dsn=os.environ["PG_DSN"], table="totals_by_country_api", mode="upsert",
                      key=["country"], create_table=True),
    )  # fmt: skip
    query = pipeline.start(progress=True)
    query.awaitTermination()
    print(f"{query.epochs_committed} epochs committed: {query.records_out}")


if __name__ == "__main__":
    main()

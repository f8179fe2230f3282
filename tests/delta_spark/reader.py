"""Spark's own Delta reader as a long-lived process (run by tests/support_delta.py with PySpark 4.2
and delta-spark): one JSON request a line on stdin, {"path": ..., "columns": [...]}, one JSON
answer a line on stdout, {"rows": [...]} or {"error": "..."}. Nothing of eos is imported here."""

import json
import sys

from pyspark.sql import SparkSession

jars = sys.argv[1]
spark = (
    SparkSession.builder.master("local[1]")
    .appName("delta-spark-reader")
    .config("spark.jars", jars)
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.shuffle.partitions", "1")
    .config("spark.databricks.delta.snapshotPartitions", "1")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
print(json.dumps({"ready": spark.version}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    try:
        frame = spark.read.format("delta").load(request["path"])
        if request.get("columns"):
            frame = frame.select(*request["columns"])
        rows = [row.asDict(recursive=True) for row in frame.collect()]
        print(json.dumps({"rows": rows}, default=str), flush=True)
    except Exception as exc:  # the test shows it
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}), flush=True)

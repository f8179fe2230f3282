"""Spark's own Delta reader as a long-lived process (run by tests/support_delta.py with PySpark 4.2
and delta-spark): one JSON request a line on stdin, {"path": ..., "columns": [...]}, one JSON
answer a line on stdout, {"rows": [...]} or {"error": "..."}. Nothing of eos is imported here.

A request may carry "hadoop": {name: value}, Hadoop settings for the table's filesystem (an s3a://
endpoint and credentials): they come on stdin, never on a command line, and are set before the
read (the filesystem cache is off for s3a, so each read uses the settings it came with)."""

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
    .config("spark.hadoop.fs.s3a.impl.disable.cache", "true")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
print(json.dumps({"ready": spark.version}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    try:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for name, value in (request.get("hadoop") or {}).items():
            hadoop.set(name, value)
        frame = spark.read.format("delta").load(request["path"])
        if request.get("columns"):
            frame = frame.select(*request["columns"])
        rows = [row.asDict(recursive=True) for row in frame.collect()]
        print(json.dumps({"rows": rows}, default=str), flush=True)
    except Exception as exc:  # the test shows it
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}), flush=True)

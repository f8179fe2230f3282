"""Building the SparkSession eos runs in, with defaults that suit short micro-batches."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from eos.paths import ops_dir

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Measured (DESIGN.md): on a local filesystem this halves the fixed checkpoint cost per micro-batch.
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def is_local_path(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def default_conf(master: str, checkpoint: str | None = None) -> dict[str, str]:
    cores = os.cpu_count() or 2
    conf = {
        "spark.master": master,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # 200 shuffle partitions is for batch jobs; a micro-batch wants about one per core (and a
        # stateful pipeline's slots are its shuffle partitions).
        "spark.sql.shuffle.partitions": str(cores),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    if os.environ.get("EOS_SPARK_LOG") != "verbose":
        conf["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={ops_dir() / 'spark' / 'log4j2.properties'}"
        )
    if checkpoint is None or is_local_path(checkpoint):
        conf["spark.sql.streaming.checkpointFileManagerClass"] = LOCAL_CHECKPOINT_FILE_MANAGER
    elif checkpoint.startswith("hdfs://"):
        # The HDFS client does not retry NameNode calls by default: a NameNode restart would fail
        # the epoch's checkpoint writes at once. Retry every ~1 s for up to 2 minutes instead
        # (measured: a streaming micro-batch rides out a NameNode restart in ~13 s).
        conf["spark.hadoop.dfs.client.retry.policy.enabled"] = "true"
        conf["spark.hadoop.dfs.client.retry.policy.spec"] = "1000,120"
    return conf


def build_spark(
    app_name: str = "eos",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
):
    """A SparkSession: local[*] unless a master is given (or spark-submit already chose one)."""
    under_spark_submit = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if "PYSPARK_PYTHON" not in os.environ and not under_spark_submit and (master or "local").startswith("local"):
        # Local Python workers must run this interpreter (with eos and its dependencies
        # installed), not whichever `python3` is first on PATH. On a cluster the executors'
        # interpreter is the deployment's business (spark.pyspark.python, an --archives venv).
        os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    from pyspark.sql import SparkSession

    settings = default_conf(master or "local[*]", checkpoint)
    if master is None and under_spark_submit:
        # Under spark-submit the JVM already runs with the master the user chose.
        settings.pop("spark.master")
    settings.update(conf or {})
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

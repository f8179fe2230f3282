"""Test support: a real Spark standalone cluster (master + workers) from the PySpark wheel."""

from __future__ import annotations

from pathlib import Path

from eos_ops.sparkcluster import LocalSparkCluster


def start_spark_cluster_under_test(workdir: Path, workers: int = 2) -> LocalSparkCluster:
    """Starts a cluster of `workers` one-core workers in `workdir` and waits until all are ALIVE.

    The caller stops it (`cluster.stop()`); start it once per module or session, since a cold
    start costs 10-40 s on a loaded 2-core machine."""
    cluster = LocalSparkCluster(workdir, workers=workers, cores_per_worker=1, memory_per_worker="1g")
    try:
        cluster.start(progress=print)
    except BaseException:
        cluster.stop()
        raise
    return cluster

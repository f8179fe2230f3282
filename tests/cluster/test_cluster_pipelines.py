"""eos on a real cluster (issue 12): the job submitted with `spark-submit` to a Spark standalone
cluster (a master and two one-core workers from the PySpark wheel; executors in the workers'
JVMs talk to the driver's vote service over TCP), its checkpoint on a real HDFS, its topics on
the 3-broker Kafka cluster. The faults only clusters have, each checked by `eos verify` and by a
read_committed reader that shares no code with eos: 0 lost, 0 duplicated."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import yaml

import eos.job
from eos.protocol.checkpoint import scratch_dir
from eos_connectors.kafka import ids
from eos_ops.sparkcluster import QUICK_START_CONF
from tests.faults.test_fault_matrix import eos_verify
from tests.pipelines import passthrough_pipeline, produce_numbered, write_pipeline
from tests.support import Later, independent_committed_values, wait_for

pytestmark = pytest.mark.slow

JOB = Path(eos.job.__file__)
# Test-only: executor and driver JVMs that start fast (see eos_ops.sparkcluster.QUICK_START_CONF).
SUBMIT_CONF = {**QUICK_START_CONF, "spark.sql.shuffle.partitions": "2"}


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(spark_cluster):
    """A test that fails while its submitted job runs must not leave that job holding the shared
    cluster's cores: the next tests' jobs would wait for executors until they time out. (Not for
    tests/cluster as a whole: test_spark_cluster.py keeps one application across its tests.)"""
    yield
    if left := spark_cluster.kill_submissions():
        print(f"killed spark-submit processes {left}, which outlived their test")


def _check(bootstrap: str, source: str, sink: str, sent: list[str], suffix: str = "") -> None:
    regex = ["--output-id-regex", f"^(.*){suffix}$"] if suffix else []
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink, *regex)
    assert report["ok"] and report["lost"] == report["duplicated"] == report["unexpected"] == 0, report
    assert sorted(independent_committed_values(bootstrap, sink, timeout_s=120)) == sorted(v + suffix for v in sent)


# A Python transform in a module beside the pipeline file, with a UDF: the executors must import the
# module too. eos ships it (SparkContext.addPyFile) whatever the deployment; nothing is installed.
BESIDE_THE_FILE = """\
from pyspark.sql import functions as F


@F.udf("string")
def exclaim(value):
    return value + "!"


def exclaimed(df):
    return df.select("key", exclaim("value").alias("value"))
"""


def _pipeline(tmp_path: Path, hdfs, name: str, bootstrap: str, source: str, sink: str, **epochs) -> Path:
    checkpoint = f"{hdfs.url}/eos/{name}-{uuid.uuid4().hex[:6]}"
    config = passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=300, **epochs)
    return write_pipeline(tmp_path, config)


def _fired(checkpoint: str, prefix: str) -> bool:
    folder = scratch_dir(checkpoint) / "failpoints"
    return folder.is_dir() and any(p.name.startswith(prefix) for p in folder.iterdir())


def _submit(spark_cluster, path: Path, *args: str):
    return spark_cluster.submit(JOB, [str(path), *args], conf=SUBMIT_CONF)


def test_the_readme_commands_with_an_hdfs_checkpoint_survive_a_kill(
    spark_cluster, hdfs, bootstrap, new_topic, unique_name, tmp_path
):
    """`spark-submit eos/job.py PIPELINE` as README says, the checkpoint at hdfs://: the driver is
    killed (-9) after epoch 1 committed its output but before Spark's commit log, and resubmitted."""
    source, sink = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 900)
    path = _pipeline(tmp_path, hdfs, unique_name("p"), bootstrap, source, sink)
    # ... with a Python transform whose module sits beside the file (README: "Transforms in Python").
    (tmp_path / "shouting.py").write_text(BESIDE_THE_FILE)
    config = yaml.safe_load(path.read_text())
    config["transforms"] = [{"name": "loud", "python": "shouting:exclaimed"}]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    crashed = _submit(spark_cluster, path, "--failpoint", "epoch.after_commit=kill@epoch=1")
    assert crashed.wait(600) != 0
    assert "kill -9 at epoch.after_commit" in crashed.output(), crashed.log_tail()
    _submit(spark_cluster, path).finish(600)
    _check(bootstrap, source, sink, sent, suffix="!")


def test_workers_brokers_and_the_namenode_fail_under_a_running_job(
    spark_cluster, hdfs, cluster, bootstrap, new_topic, unique_name, tmp_path
):
    """One submitted job, four faults, each landing inside an epoch (held there by a pause):
    - epoch 0, read stage: both read tasks pause; worker 1 is killed with its executor (Spark
      re-runs its task on worker 0, which then has one task slot for two tasks);
    - epoch 2, slots pre-committed: worker 0 is killed (worker 1 is back by then);
    - epoch 3: the broker leading the transaction coordinator of the sink's ids is killed;
    - epoch 5, right after the offsets were logged: the NameNode is restarted."""
    source, sink = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 2100)
    name = unique_name("p")
    path = _pipeline(tmp_path, hdfs, name, bootstrap, source, sink, tolerable_failures=8, timeout="90s")
    checkpoint = yaml.safe_load(path.read_text())["checkpoint"]
    job = _submit(
        spark_cluster, path,
        "--failpoint", "source.read=pause(8)@times=2",
        "--failpoint", "sink.after_precommit=pause(8)@epoch=2,attempt=1,times=2",
        "--failpoint", "sink.after_precommit=pause(4)@epoch=3,slot=0,attempt=1",
        "--failpoint", "epoch.after_offsets_logged=pause(6)@epoch=5",
    )  # fmt: skip

    def step(prefix: str, what: str) -> None:
        wait_for(lambda: _fired(checkpoint, prefix) or job.poll() is not None, 400, what)
        assert job.poll() is None, job.log_tail()

    step("source_read_pause", "a read task paused")
    spark_cluster.kill_worker(1)
    restarts = [Later(5, lambda: spark_cluster.start_worker(1))]

    step("sink_after_precommit_pause_8_epoch_2", "epoch 2 pre-committed")
    time.sleep(1)
    spark_cluster.wait_for_workers([1], timeout=180)
    spark_cluster.kill_worker(0)
    restarts.append(Later(5, lambda: spark_cluster.start_worker(0)))

    step("sink_after_precommit_pause_4_epoch_3", "epoch 3 pre-committed")
    victim = cluster.transaction_coordinator(ids.pool_id(ids.default_prefix(name), "out", 0))
    cluster.kill(victim)
    restarts.append(Later(8, lambda: cluster.start_node(victim)))

    step("epoch_after_offsets_logged_pause_6_epoch_5", "epoch 5 logged")
    hdfs.restart_namenode()

    job.finish(900)
    for restart in restarts:
        restart.join()
    spark_cluster.wait_for_workers([0, 1], timeout=180)
    cluster.wait_until_healthy(timeout=180)
    _check(bootstrap, source, sink, sent)


def test_the_driver_killed_alone_and_restarted_with_a_new_vote_address(
    spark_cluster, hdfs, bootstrap, new_topic, unique_name, tmp_path, free_port
):
    """kill -9 of the driver's processes only (spark-submit's JVM and the Python driver) while
    both slots of epoch 1 hold pre-committed transactions in the executors' Python workers: zombie
    tasks. The new driver listens for votes elsewhere (another port); it fences the zombies'
    transactional ids, replays epoch 1 and finishes."""
    source, sink = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce_numbered(bootstrap, source, 0, 900)
    path = _pipeline(tmp_path, hdfs, unique_name("p"), bootstrap, source, sink)
    checkpoint = yaml.safe_load(path.read_text())["checkpoint"]
    job = _submit(spark_cluster, path, "--failpoint", "sink.after_precommit=pause(20)@epoch=1,times=2")
    wait_for(lambda: _fired(checkpoint, "sink_after_precommit") or job.poll() is not None, 400, "epoch 1")
    assert job.poll() is None, job.log_tail()
    time.sleep(1)
    for pid in spark_cluster.driver_pids(job):
        os.kill(pid, signal.SIGKILL)
    job.wait(60)

    config = yaml.safe_load(path.read_text())
    config["coordinator"] = {"port": free_port}
    write_pipeline(tmp_path, config)
    _submit(spark_cluster, path).finish(900)
    _check(bootstrap, source, sink, sent)
    spark_cluster.wait_for_workers([0, 1], timeout=180)


@pytest.fixture
def free_port() -> int:
    from eos_ops.localkafka import free_port as pick

    return pick()

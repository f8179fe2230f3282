"""The Python API (docs/PYTHON_API.md): a pipeline built in code on the user's SparkSession, its
handle in PySpark's idiom, its errors, and a subset of the fault matrix run through it."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

import pytest
from pyspark.sql import functions as F

import eos
from eos.errors import ConfigError
from eos_connectors import kafka, postgres
from tests.pipelines import ROOT, assert_exactly_once, committed_values, produce_numbered
from tests.support import independent_committed_values


def test_a_pipeline_in_code_runs_exactly_once_and_its_handle_speaks_pyspark(
    spark, bootstrap, new_topic, unique_name, tmp_path
):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 600)
    pipeline = eos.Pipeline(
        unique_name("api"), tmp_path / "ck", spark=spark, epochs=eos.Epochs(trigger="200ms", slots=2, timeout="60s")
    )
    events = pipeline.source(
        kafka.Source("events", bootstrap=bootstrap, topics=[source], key_format="string", value_format="string",
                     max_records_per_epoch=250)
    )  # fmt: skip
    assert events.isStreaming and events.columns[:2] == ["key", "value"]
    pipeline.sink(
        events.select("key", F.upper("value").alias("value")),
        kafka.Sink("out", bootstrap=bootstrap, topic=sink, key="key", value="value", value_format="string"),
    )
    query = pipeline.start()
    try:
        assert isinstance(query, eos.EosQuery) and query.isActive
        deadline = time.monotonic() + 120
        while committed_values(bootstrap, sink) != Counter(v.upper() for v in sent):
            assert time.monotonic() < deadline, "the pipeline did not catch up"
            assert query.awaitTermination(0.5) is False  # still running
        assert query.lastProgress is not None and query.lastProgress["batchId"] >= 2  # 600 at <= 250 an epoch
        assert set(query.status) >= {"message", "isDataAvailable", "isTriggerActive"}
        assert query.epochs_committed >= 3 and query.records_out["out"] == 600
    finally:
        query.stop()  # graceful: the epoch in flight finishes
    assert not query.isActive and query.exception() is None
    assert_exactly_once([v.upper() for v in sent], committed_values(bootstrap, sink))
    assert sorted(independent_committed_values(bootstrap, sink)) == sorted(v.upper() for v in sent)


def test_mistakes_in_code_are_clear_errors(spark, bootstrap, new_topic, unique_name, tmp_path):
    with pytest.raises(
        ConfigError, match=re.escape("kafka.Source('events'): kafka.topics: List should have at least 1")
    ):
        kafka.Source("events", bootstrap=bootstrap, topics=[])
    with pytest.raises(ConfigError, match=re.escape("mode: upsert needs `key: [columns]`")):
        postgres.Sink("t", dsn="host=x dbname=y", table="t", mode="upsert")
    with pytest.raises(ConfigError, match=re.escape("eos.Pipeline: name: String should match pattern")):
        eos.Pipeline("no/slash", tmp_path / "ck", spark=spark)
    source = new_topic()
    pipeline = eos.Pipeline(unique_name("api"), tmp_path / "ck", spark=spark)
    events = pipeline.source(kafka.Source("events", bootstrap=bootstrap, topics=[source], value_format="string"))
    with pytest.raises(ConfigError, match="must be a streaming DataFrame"):
        pipeline.sink(spark.range(3), kafka.Sink("out", bootstrap=bootstrap, topic=source))
    with pytest.raises(ConfigError, match="two sources are named 'events'"):
        pipeline.source(kafka.Source("events", bootstrap=bootstrap, topics=[source]))
    with pytest.raises(ConfigError, match="has no sink"):
        pipeline.start()
    assert events.isStreaming
    pipeline.close()


def run_api_app(*args: str) -> object:
    import os
    import signal
    import subprocess

    from tests.pipelines import Finished

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "apps" / "api_pipeline.py"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"the API pipeline did not finish:\n{output[-3000:]}") from None
    return Finished(proc.returncode, output)


@pytest.mark.parametrize("point", ["sink.after_precommit", "sink.after_agreement"])
def test_the_fault_matrix_through_the_api(point, bootstrap, postgres, new_topic, unique_name, tmp_path):
    """kill -9 of the process that runs the user's code (driver, Spark JVM, Python workers) at a
    protocol point, then the same program again: the topic and the table hold each record once."""
    import psycopg

    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900, keys=7)
    table = unique_name("counts").replace("-", "_")
    args = [bootstrap, source, sink, str(tmp_path / "ck"), "--dsn", postgres, "--table", table]
    crashed = run_api_app(*args, "--failpoint", f"{point}=kill@epoch=1")
    assert crashed.killed, f"the failpoint {point} did not fire:\n{crashed.output[-3000:]}"
    finished = run_api_app(*args)
    assert finished.returncode == 0, finished.output[-3000:]
    assert_exactly_once([v.upper() for v in sent], committed_values(bootstrap, sink))
    assert sorted(independent_committed_values(bootstrap, sink)) == sorted(v.upper() for v in sent)
    with psycopg.connect(postgres) as conn:
        counts = dict(conn.execute(f"SELECT key, n FROM {table}").fetchall())
    assert counts == dict(Counter(f"k{i % 7}" for i in range(900)))

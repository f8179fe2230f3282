"""The SparkSession eos builds: its Python processes import PySpark compiled, not from Spark's zip, have
no Spark jar on their path, and keep their imports out of the collection PySpark runs after every
task."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark

from eos.sparksession import compiled_spark_home, local_python, python_launcher

PACKAGE = Path(pyspark.__file__).resolve().parent


def _pyspark_seen_by_a_worker(_rows):
    import pyspark as worker_pyspark

    yield worker_pyspark.__file__


def test_local_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    # Spark puts $SPARK_HOME/python/lib/pyspark.zip first on its Python processes' path; from
    # a zip every process compiles PySpark again (~0.5 s each, six per eos start).
    seen = spark.sparkContext.parallelize([0], 1).mapPartitions(_pyspark_seen_by_a_worker).collect()
    assert len(seen) == 1
    assert ".zip" not in seen[0], seen[0]
    assert Path(seen[0]).resolve().parent == PACKAGE


def _jars_on_the_path(_rows):
    import sys as worker_sys

    yield [entry for entry in worker_sys.path if entry.endswith(".jar")]


def test_local_python_workers_have_no_spark_jar_on_their_path(spark):
    # Spark appends its spark-core jar to every Python process's path; Python read the jar's
    # ~6,000-entry directory in each of them (30 ms), and again at its first task.
    [seen] = spark.sparkContext.parallelize([0], 1).mapPartitions(_jars_on_the_path).collect()
    assert seen == [], seen


def test_the_launcher_takes_only_spark_s_jar_off_the_path_and_runs_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("EOS_HOME", str(tmp_path / "eos home"))
    # An interpreter path with a space and a quote, as the launcher must pass it on intact.
    python = tmp_path / "a venv's bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    launcher = python_launcher(str(python))
    assert launcher is not None and launcher.is_relative_to(tmp_path / "eos home")
    assert python_launcher(str(python)) == launcher  # made once, then reused
    path = [
        "/spark/python/lib/pyspark.zip",
        "/spark/jars/spark-core_2.13-4.3.0.jar",
        "/other dir/with space",
        "/mine/tool.jar",
        "*",
    ]
    shown = subprocess.run(
        [str(launcher), "-c", "import os, sys; print(sys.executable); print(os.environ['PYTHONPATH'])"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert shown == [str(python), os.pathsep.join(p for p in path if "spark-core" not in p)]


def test_a_launcher_that_cannot_run_is_not_used(tmp_path, monkeypatch):
    # As on a filesystem mounted noexec: Spark's Python processes would all fail to start.
    monkeypatch.setenv("EOS_HOME", str(tmp_path))
    assert python_launcher(str(tmp_path / "no-such-python")) is None
    assert list((tmp_path / "spark-python").iterdir()) == []  # nothing half-made left behind


def _collection_after_a_task_side_call(_rows):
    import gc

    from eos.errors import crossing

    with crossing():  # as every eos task does (reader, slot, codec UDFs)
        pass
    yield f"{gc.get_freeze_count()} {len(gc.get_objects())}"


def test_a_python_worker_keeps_its_imports_out_of_the_collection_after_each_task(spark):
    # PySpark's daemon runs a full gc.collect() after every task of a reused worker; walking the
    # imports took 50-100 ms of GIL on a busy machine, while the worker's commit thread waited.
    frozen, tracked = map(int, spark.sparkContext.parallelize([0], 1).mapPartitions(
        _collection_after_a_task_side_call).collect()[0].split())  # fmt: skip
    assert frozen > 10_000, f"only {frozen} objects frozen in the worker"
    assert tracked < frozen / 10, f"the collection still walks {tracked} objects (frozen: {frozen})"


def test_dataframe_calls_do_not_record_their_call_site(spark):
    # Recording it costs ~5 JVM round trips per DataFrame function call (half of a start-up's).
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False


def _socket_kinds(_: object) -> Iterator[list[str]]:
    """In a task: the kind of every socket of its Python worker (the JVM connection among them)."""
    import os
    from pathlib import Path

    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    unix = {line.split()[6] for line in lines if len(line.split()) > 6}
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            kinds.append("unix" if link[8:-1] in unix else "other")
    yield [os.environ.get("PYTHON_WORKER_FACTORY_SOCK_DIR") or "no socket dir", *sorted(kinds)]


def test_python_workers_talk_to_the_jvm_over_unix_sockets(spark):
    # Over loopback TCP, a read task waited 40 ms for its ranges in every epoch (Nagle's
    # algorithm against delayed ACKs); a Unix domain socket has neither.
    assert spark.conf.get("spark.python.unix.domain.socket.enabled") == "true"
    [seen] = spark.sparkContext.parallelize([0], 1).mapPartitions(_socket_kinds).collect()
    assert seen[0] != "no socket dir" and "unix" in seen[1:], seen


def test_the_mirror_is_the_pyspark_distribution_without_its_zips(tmp_path, monkeypatch):
    monkeypatch.setenv("EOS_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    mirror = compiled_spark_home(sys.executable)
    assert mirror is not None and mirror.is_relative_to(tmp_path)
    assert (mirror / "jars").resolve() == PACKAGE / "jars"
    assert (mirror / "bin" / "spark-submit").exists()
    assert not (mirror / "python" / "lib").exists()
    assert compiled_spark_home(sys.executable) == mirror  # made once, then reused
    assert [p.name for p in (tmp_path / "spark-home").iterdir()] == [mirror.name]  # no partial left


def test_the_zip_stays_where_spark_may_run_another_python(tmp_path, monkeypatch):
    monkeypatch.setenv("EOS_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    # Another virtualenv's python is a symlink to the same base interpreter, without this pyspark.
    other = tmp_path / "other-venv" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.symlink_to(Path(sys.executable).resolve())
    assert compiled_spark_home(str(other)) is None
    assert compiled_spark_home(None) is None


def test_the_launcher_goes_with_the_mirror_and_never_replaces_a_python_the_user_named(tmp_path, monkeypatch):
    # One decision for a local session and eos's standalone cluster (eos_ops.sparkcluster).
    monkeypatch.setenv("EOS_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    mirror, program = local_python(sys.executable)
    assert mirror == compiled_spark_home(sys.executable) and mirror is not None
    assert program == str(python_launcher(sys.executable)) and program != sys.executable
    assert local_python(sys.executable, launch=False) == (mirror, sys.executable)
    other = tmp_path / "other-venv" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.symlink_to(Path(sys.executable).resolve())
    assert local_python(str(other)) == (None, str(other))  # no mirror: no launcher either
    assert local_python(None) == (None, None)


def test_the_status_store_keeps_few_sql_executions_while_the_ui_is_off(spark):
    # Spark keeps 1,000 by default, each with its plan graph and metrics; a pipeline runs two or
    # three per epoch, and nobody sees them while the UI is off.
    import time

    for _ in range(60):
        spark.range(1).collect()
    store = spark._jsparkSession.sharedState().statusStore()
    deadline = time.monotonic() + 20
    while store.executionsCount() > 50 and time.monotonic() < deadline:
        time.sleep(0.2)  # the listener bus applies the cleanup after the executions end
    assert store.executionsCount() <= 50
    assert spark.sparkContext.getConf().get("spark.sql.ui.retainedExecutions") == "50"


def test_a_pipelines_source_runners_are_forked_from_the_fork_server(spark, bootstrap, new_topic, unique_name, tmp_path):
    # Spark starts a Python process per scan when a query starts, one after the other; each new
    # interpreter spent ~0.2 s importing PySpark. The fork server has them imported (eos.runnerforks).
    from eos import runnerforks
    from tests.pipelines import eos_subprocess, passthrough_pipeline, produce_numbered, run_in_process, write_pipeline

    socket_path = os.environ.get(runnerforks.SOCKET_ENV)
    assert socket_path, "the session's launcher was given no fork server"
    before = runnerforks.request(socket_path, {"stats": True})["served"]
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 50)
    config = passthrough_pipeline(unique_name("f"), bootstrap, source, sink, tmp_path / "ck")
    result = run_in_process(spark, write_pipeline(tmp_path, config))
    assert sum(result.records_out.values()) == 50
    served = runnerforks.request(socket_path, {"stats": True})["served"] - before
    assert served >= 2, f"{served} source runners forked; a pipeline has two scans per source"

    # An eos process started from this one inherits the variable naming this server, and must
    # not use it: its runners would be this process's children, in this process's group (a
    # failpoint's kill -9 of the group took the test run with it).
    sink = new_topic(partitions=2)
    config = passthrough_pipeline(unique_name("g"), bootstrap, source, sink, tmp_path / "ck2")
    started = eos_subprocess("run", str(write_pipeline(tmp_path / "child", config)))
    assert started.returncode == 0, started.output[-3000:]
    assert runnerforks.request(socket_path, {"stats": True})["served"] - before == served

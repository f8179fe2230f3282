"""The ways in: `spark-submit eos/job.py`, the demo, and what must never leak (secrets)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import eos.job
from tests.pipelines import (
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)


def test_the_job_runs_under_spark_submit(bootstrap, new_topic, unique_name, tmp_path):
    import pyspark

    source, sink = new_topic(partitions=2), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 300)
    path = write_pipeline(tmp_path, passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck"))
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(
        [str(spark_submit), "--master", "local[2]", eos.job.__file__, str(path), "--trigger", "available-now"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "epochs committed" in result.stdout + result.stderr  # spark-submit merges Python's stderr
    assert_exactly_once(sent, committed_values(bootstrap, sink))


def test_a_sigterm_to_spark_submit_stops_the_job_cleanly(bootstrap, new_topic, unique_name, tmp_path):
    """SIGTERM to spark-submit's JVM (what `kill`, `docker stop` or Kubernetes send): its shutdown
    hook has eos finish the epoch in flight before Spark stops the SparkContext, and eos's log
    levels hold in the JVM it did not start. Before, the SparkContext stopped under the query:
    "ERROR MicroBatchExecution: Query ... terminated with error ... RpcEnv already stopped"."""
    import re
    import signal
    import time

    import pyspark

    source, sink = new_topic(partitions=2), new_topic()
    sent = produce_numbered(bootstrap, source, 0, 3000)
    name = unique_name("p")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=200)
    config["epochs"]["trigger"] = "200ms"
    path = write_pipeline(tmp_path, config)
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("EOS_SPARK_LOG", None)
    proc = subprocess.Popen(
        [str(spark_submit), "--master", "local[2]", eos.job.__file__, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if sum(" committed | " in seen for seen in lines) == 2:
            os.kill(proc.pid, signal.SIGTERM)  # spark-submit execs the JVM: this is the JVM
            break
        assert time.monotonic() < deadline, "\n".join(lines)
    lines += proc.stdout.read().splitlines()
    text = "\n".join(lines)
    assert proc.wait(120) in (0, 143), text  # the JVM exits as SIGTERM says, once eos has stopped
    assert "eos: Spark's JVM is shutting down: finishing the current epoch, then stopping" in lines, text
    summary = [line for line in lines if line.startswith(f"eos: {name} stopped (")]
    assert summary and " epochs committed, records out: out " in summary[0], text
    # Once eos runs, Spark says nothing: no error, no stack trace, none of its harmless warnings.
    started = next(i for i, line in enumerate(lines) if line.startswith(f"eos: {name}: Spark started in"))
    noise = re.compile(r"ERROR|Exception|Traceback|\bWARN\b|\bINFO\b")
    assert not [line for line in lines[started:] if noise.search(line)], text
    # What the committed epochs wrote, once each.
    epochs = [int(m[1]) for m in (re.search(r" \| out: out (\d+) \| ", line) for line in lines) if m]
    committed = committed_values(bootstrap, sink)
    assert sum(committed.values()) == sum(epochs) > 0 and max(committed.values()) == 1, text
    assert set(committed) <= set(sent)


def test_secrets_never_reach_the_checkpoint_or_the_output(bootstrap, new_topic, unique_name, tmp_path):
    secret = "s3cr3t-" + unique_name("x")
    source, sink = new_topic(), new_topic()
    produce_numbered(bootstrap, source, 0, 50)
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    # A real client setting librdkafka accepts with PLAINTEXT (it is used only with SASL).
    config["sources"][0]["kafka"]["config"] = {"sasl.password": "${EOS_TEST_SECRET}"}
    config["sinks"][0]["kafka"]["config"] = {"sasl.password": "${EOS_TEST_SECRET}"}
    path = write_pipeline(tmp_path, config)
    env = {"EOS_TEST_SECRET": secret}
    validated = eos_subprocess("validate", str(path), "--json", env=env)
    ran = eos_subprocess("run", str(path), env=env)
    assert validated.returncode == 0 and ran.returncode == 0, ran.output[-3000:]
    assert '"sasl.password": "***"' in validated.output
    assert secret not in validated.output + ran.output
    for file in (tmp_path / "ck").rglob("*"):
        if file.is_file():
            assert secret.encode() not in file.read_bytes(), f"the secret was written to {file}"


def test_the_demo_output_matches_the_generators_ground_truth(bootstrap, postgres, tmp_path):
    """`eos demo` on the test broker and PostgreSQL (smaller input): its own check compares every
    window of the committed topic and of the table with the counts the generator recorded; exit 0
    only if all match."""
    env = {"EOS_BOOTSTRAP": bootstrap, "EOS_PG_DSN": postgres, "EOS_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    args = ("demo", "--external-kafka", "--external-postgres", "--events", "6000")
    finished = eos_subprocess(*args, env=env, timeout=600)
    assert finished.returncode == 0, finished.output[-3000:]
    for output in ("topic campaign-counts", "table campaign_counts"):
        assert f"check ({output}):  EXACTLY ONCE: every window matches the ground truth" in finished.output
    # Spark's harmless warnings, once per run or per stateful epoch, would read as problems.
    noise = ("WARN LogicalRDD", "WARN ResolveWriteToStream", "WARN DataSourceManager")
    repeated = [line for line in finished.output.splitlines() if any(n in line for n in noise)]
    assert not repeated, "\n".join(repeated)

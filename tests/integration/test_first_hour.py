"""A PySpark user's first hour (issue 36): the ordinary mistakes of a new pipeline, each run through
the real `eos run` and timed. Each must end with one clean message that names the pipeline file's
line and the fix, the documented exit code, no traceback, and nothing left behind (no checkpoint
metadata, nothing written); what Spark is not needed for is found before Spark starts, and what
needs Spark within 10 s of eos's own time after Spark is up.

The pipeline is the one a new user wrote from the docs: JSON orders -> a SQL filter and aggregate
-> a Kafka topic (update mode) and a PostgreSQL upsert table, with a dead-letter queue.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.pipelines import ROOT, all_values

CONFIG, ENVIRONMENT, REFUSED = 2, 1, 3
SPARK_UP = "Spark started in"
AFTER_SPARK_S = 10.0  # the bound on eos's own time from Spark being up to the error
BEFORE_SPARK_S = 15.0  # a process start, imports and the checks of every system (no Spark)

ORDERS_SQL = """\
SELECT country, sum(amount) AS total, count(*) AS orders
FROM orders
WHERE status = 'paid'
GROUP BY country
"""


def orders_pipeline(name: str, bootstrap: str, source: str, sink: str, dsn: str, table: str, ck: Path) -> dict:
    return {
        "name": name,
        "checkpoint": str(ck),
        "epochs": {"trigger": "available-now", "output_mode": "update", "slots": 2},
        "sources": [
            {
                "name": "orders",
                "kafka": {"bootstrap": bootstrap, "topics": [source]},
                "value_format": {
                    "type": "json",
                    "schema": "order_id STRING, country STRING, amount DOUBLE, status STRING",
                },
                "on_error": "dlq",
                "dlq_topic": f"{source}-dlq",
            }
        ],
        "transforms": [{"name": "paid_by_country", "sql": ORDERS_SQL}],
        "sinks": [
            {"name": "totals", "kafka": {"bootstrap": bootstrap, "topic": sink}, "key": "country"},
            {
                "name": "totals_pg",
                "postgres": {"dsn": dsn, "table": table, "mode": "upsert", "key": ["country"], "create_table": True},
            },
        ],
    }


@dataclass
class Run:
    returncode: int
    lines: list[tuple[float, str]]  # (seconds since start, line)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    @property
    def error(self) -> str:
        starts = [i for i, (_, line) in enumerate(self.lines) if line.startswith("error:")]
        assert starts, self.output[-3000:]
        return "\n".join(line for _, line in self.lines[starts[-1] :])

    @property
    def spark_started(self) -> float | None:
        return next((t for t, line in self.lines if SPARK_UP in line), None)

    @property
    def seconds(self) -> float:
        return self.lines[-1][0] if self.lines else 0.0


def eos_run(path: Path, timeout: float = 300) -> Run:
    """`eos run PATH`, each output line stamped with the time it arrived."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
            if time.monotonic() - started > timeout:
                raise AssertionError("eos run did not end:\n" + "\n".join(t for _, t in lines[-40:]))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines.append((time.monotonic() - started, ""))
    return Run(proc.returncode, lines)


@pytest.fixture
def orders(bootstrap, postgres, new_topic, unique_name, tmp_path):
    source = new_topic(partitions=2)
    sink = new_topic()
    table = unique_name("totals").replace("-", "_")

    def write(change=None, name: str | None = None) -> tuple[Path, dict]:
        config = orders_pipeline(
            name or unique_name("orders"), bootstrap, source, sink, postgres, table, tmp_path / "ck"
        )
        if change is not None:
            change(config)
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path, config

    write.tmp = tmp_path  # type: ignore[attr-defined]
    write.sink = sink  # type: ignore[attr-defined]
    write.source = source  # type: ignore[attr-defined]
    return write


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the pipeline file where `text` first appears."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} is not in {path}")


def assert_clean(run: Run, path: Path, code: int, *, line: int, says: list[str], spark: bool, tmp: Path) -> None:
    message = run.error
    print(f"\n{path.name}: exit {run.returncode} after {run.seconds:.1f} s: {message}")  # -rP shows the table
    assert run.returncode == code, run.output[-3000:]
    assert f"{path}:{line}" in message, message
    for text in says:
        assert text in message, message
    assert "Traceback" not in run.output, run.output[-3000:]
    if spark:
        assert run.spark_started is not None, run.output[-3000:]
        assert run.seconds - run.spark_started < AFTER_SPARK_S, f"{run.seconds - run.spark_started:.1f} s after Spark"
    else:
        assert run.spark_started is None, "Spark was started for a mistake found without it"
        assert run.seconds < BEFORE_SPARK_S, f"{run.seconds:.1f} s"
    assert not (tmp / "ck" / "_eos" / "pipeline.json").exists(), "the checkpoint's metadata was left behind"


def test_bad_sql_names_the_line_of_the_sql_and_shows_where(orders):
    path, _ = orders(lambda c: c["transforms"][0].update(sql=ORDERS_SQL.replace("WHERE", "WHER")))
    run = eos_run(path)
    assert_clean(run, path, CONFIG, line=line_of(path, "WHER status"), spark=True, tmp=orders.tmp,
                 says=["transform 'paid_by_country':", "Syntax error", "SQL line 3", "^^^"])  # fmt: skip


def test_an_unknown_column_names_the_line_and_the_columns_there_are(orders):
    path, _ = orders(lambda c: c["transforms"][0].update(sql=ORDERS_SQL.replace("sum(amount)", "sum(amout)")))
    run = eos_run(path)
    assert_clean(run, path, CONFIG, line=line_of(path, "sum(amout)"), spark=True, tmp=orders.tmp,
                 says=["`amout` cannot be resolved", "`amount`"])  # fmt: skip


def test_an_aggregate_in_append_mode_without_a_watermark_says_what_to_change(orders):
    path, _ = orders(lambda c: c["epochs"].update(output_mode="append"))
    run = eos_run(path)
    assert_clean(run, path, CONFIG, line=line_of(path, "output_mode: append"), spark=True, tmp=orders.tmp,
                 says=["output mode append", "without watermark", "output_mode: update"])  # fmt: skip


def test_an_upsert_key_that_is_not_a_column_is_named(orders):
    path, _ = orders(lambda c: c["sinks"][1]["postgres"].update(key=["window_start"]))
    run = eos_run(path)
    assert_clean(run, path, CONFIG, line=line_of(path, "name: totals_pg"), spark=True, tmp=orders.tmp,
                 says=["'window_start'", "country, total, orders"])  # fmt: skip


def test_a_missing_python_module_is_found_before_spark_with_where_modules_are_looked_up(orders):
    def python_transform(config: dict) -> None:
        config["transforms"].insert(0, {"name": "cleaned", "input": "orders", "python": "mytransforms:clean"})

    path, _ = orders(python_transform)
    run = eos_run(path)
    assert_clean(run, path, CONFIG, line=line_of(path, "python: mytransforms:clean"), spark=False, tmp=orders.tmp,
                 says=["No module named 'mytransforms'", "put mytransforms.py beside the pipeline file"])  # fmt: skip


def test_a_module_beside_the_pipeline_file_is_imported(orders, bootstrap):
    """...and once it is there, the same pipeline runs: the module is found on the driver and by the
    executors' Python workers (its UDF runs there)."""
    (orders.tmp / "mytransforms.py").write_text(
        "from pyspark.sql import functions as F\n\n"
        "@F.udf('string')\ndef upper(v):\n    return v.upper()\n\n"
        "def clean(df):\n    return df.withColumn('country', upper('country'))\n"
    )

    def python_transform(config: dict) -> None:
        config["transforms"].insert(0, {"name": "cleaned", "input": "orders", "python": "mytransforms:clean"})
        config["transforms"][1]["sql"] = ORDERS_SQL.replace("FROM orders", "FROM cleaned")

    _produce_orders(bootstrap, orders.source)
    path, _ = orders(python_transform)
    run = eos_run(path)
    assert run.returncode == 0, run.output[-3000:]
    countries = {r.key.decode() for r in _committed(bootstrap, orders.sink)}
    assert countries == {"DE", "FR"}, countries


def test_a_missing_topic_is_found_before_spark_with_a_suggestion(orders):
    path, _ = orders(lambda c: c["sources"][0]["kafka"].update(topics=[c["sources"][0]["kafka"]["topics"][0][:-1]]))
    run = eos_run(path)
    assert_clean(run, path, ENVIRONMENT, line=line_of(path, "- name: orders"), spark=False, tmp=orders.tmp,
                 says=["does not exist", f"did you mean '{orders.source}'"])  # fmt: skip


def test_an_unreachable_broker_is_found_before_spark(orders):
    path, _ = orders(lambda c: c["sources"][0]["kafka"].update(bootstrap="127.0.0.1:1"))
    run = eos_run(path)
    assert_clean(run, path, ENVIRONMENT, line=line_of(path, "- name: orders"), spark=False, tmp=orders.tmp,
                 says=["cannot reach Kafka at 127.0.0.1:1", "Connection refused"])  # fmt: skip


def test_a_wrong_dsn_is_found_before_spark(orders, postgres):
    wrong = postgres.replace("dbname=", "dbname=nosuchdb") if "dbname=" in postgres else postgres + " dbname=nosuchdb"
    path, _ = orders(lambda c: c["sinks"][1]["postgres"].update(dsn=wrong))
    run = eos_run(path)
    assert_clean(run, path, ENVIRONMENT, line=line_of(path, "name: totals_pg"), spark=False, tmp=orders.tmp,
                 says=["nosuchdb"])  # fmt: skip


def test_an_unwritable_checkpoint_is_found_before_spark(orders):
    (orders.tmp / "afile").write_text("not a folder")
    path, _ = orders(lambda c: c.update(checkpoint=str(orders.tmp / "afile" / "ck")))
    run = eos_run(path)
    assert_clean(run, path, ENVIRONMENT, line=line_of(path, "checkpoint:"), spark=False, tmp=orders.tmp,
                 says=["is not a folder", "choose a checkpoint location"])  # fmt: skip


def test_a_copy_with_the_same_name_is_told_to_take_its_own_name(orders, bootstrap):
    """A copied pipeline file (new checkpoint, same `name:`): the hint is to rename the copy, not the
    destructive `eos reset`."""
    _produce_orders(bootstrap, orders.source)
    path, config = orders()
    first = eos_run(path)
    assert first.returncode == 0, first.output[-3000:]
    copy = dict(config, checkpoint=str(orders.tmp / "ck-copy"))
    copy_path = orders.tmp / "copy.yaml"
    copy_path.write_text(yaml.safe_dump(copy, sort_keys=False))
    before = all_values(bootstrap, orders.sink)
    run = eos_run(copy_path)
    assert run.returncode == REFUSED, run.output[-3000:]
    assert "give the copy its own `name:`" in run.error, run.error
    assert "Traceback" not in run.output
    assert all_values(bootstrap, orders.sink) == before  # nothing written, not even aborted


def _produce_orders(bootstrap: str, topic: str) -> None:
    import json

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(40):
        record = {"order_id": f"o{i}", "country": "de" if i % 2 else "fr", "amount": 1.5, "status": "paid"}
        producer.produce(topic, json.dumps(record).encode(), f"o{i}".encode())
    producer.produce(topic, b"{not json", b"poison")
    assert producer.flush(30) == 0


def _committed(bootstrap: str, topic: str) -> list:
    from eos_ops.verify import read_topic

    return read_topic(bootstrap, topic)

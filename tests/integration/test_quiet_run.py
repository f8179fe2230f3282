"""What `eos run` prints: only eos's own lines, each one worth reading, from the first start to a
stop by SIGTERM; and the filter on Spark's stderr (eos.sparklog) never outlives the driver."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eos_connectors.kafka.clients import producer
from tests.pipelines import ROOT, committed_values, write_pipeline


def produce_orders(bootstrap: str, topic: str, count: int) -> tuple[list[str], int]:
    """JSON orders, every 25th one not JSON (a poison record); returns the good ones' ids and how
    many were poison."""
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    good, poison = [], 0
    for i in range(count):
        if i % 25 == 0:
            out.produce(topic, b"{not json", f"k{i}".encode())
            poison += 1
        else:
            value = {"id": f"o{i}", "kind": "abc"[i % 3], "amount": float(i)}
            out.produce(topic, json.dumps(value).encode(), f"k{i}".encode())
            good.append(f"o{i}")
    assert out.flush(30) == 0
    return good, poison


def test_a_first_run_prints_only_what_a_user_can_act_on(bootstrap, new_topic, unique_name, postgres, tmp_path):
    """A new user's first run: JSON in, a Kafka topic and a PostgreSQL table out (both created by
    eos), a dead-letter queue, stopped by SIGTERM to the whole process group (`kill -- -PGID`,
    systemd, a container stop: the driver and Spark's JVM at once). Every line is eos's: no JVM
    warning, no Python traceback, no Spark log line; creating the table is a note, not a warning;
    the progress lines split what went out per sink and to the DLQ; the first epoch shows no rate
    and the summary gives the rate after it; the stop finishes the epoch in flight."""
    source, dlq = new_topic(partitions=2), new_topic()
    good, poison = produce_orders(bootstrap, source, 600)
    name, sink, table = unique_name("q"), unique_name("out"), unique_name("orders").replace("-", "_")
    config = {
        "name": name,
        "checkpoint": str(tmp_path / "ck"),
        "epochs": {"trigger": "500ms", "slots": 2},
        "sources": [{
            "name": "orders",
            "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 100},
            "value_format": {"type": "json", "schema": "id STRING, kind STRING, amount DOUBLE"},
            "on_error": "dlq", "dlq_topic": dlq,
        }],
        "transforms": [{"name": "paid", "sql": "SELECT id, kind, amount FROM orders WHERE amount >= 0"}],
        "sinks": [
            {"name": "out", "input": "paid", "kafka": {"bootstrap": bootstrap, "topic": sink, "create_topic": True},
             "key": "id", "value": "id", "value_format": "string"},
            {"name": "out_pg", "input": "paid",
             "postgres": {"dsn": "${PG_DSN}", "table": table, "mode": "append", "create_table": True}},
        ],
    }  # fmt: skip
    path = write_pipeline(tmp_path, config)
    env = {**os.environ, "PG_DSN": postgres, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if sum(" committed | " in seen for seen in lines) == 2:
            os.killpg(proc.pid, signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "\n".join(lines)
    lines += proc.stdout.read().splitlines()
    text = "\n".join(lines)
    assert proc.wait(120) == 0, text

    # Only eos's own lines, and none of them a warning.
    foreign = [line for line in lines if line and not line.startswith(("eos: ", f"[{name}] "))]
    assert not foreign, text
    assert not [line for line in lines if "warning" in line.lower() or "traceback" in line.lower()], text
    assert f"eos: sink out_pg: created table {table}" in lines, text

    epochs = [line for line in lines if re.match(rf"\[{name}\] epoch \d+ committed \| ", line)]
    assert len(epochs) >= 2, text
    per_sink = re.compile(r" \| out: out (\d+), out_pg (\d+), dlq (\d+) \| ")
    assert all(per_sink.search(line) for line in epochs), text
    assert " | first epoch of the run: also starts the Python workers and plans the query, no rate | " in epochs[0]
    assert all(re.search(r" \| [\d,]+ rec/s \| ", line) for line in epochs[1:]), text

    # The stop finished the epoch in flight; the summary adds up the epochs' lines.
    summary = lines[-1]
    assert summary.startswith(f"eos: {name} stopped (SIGTERM): {len(epochs)} epochs committed, records out: "), text
    counts = [[int(n) for n in per_sink.search(line).groups()] for line in epochs]  # type: ignore[union-attr]
    out, out_pg, dead = (sum(column) for column in zip(*counts, strict=True))
    assert f"records out: out {out:,}, out_pg {out_pg:,}, dlq {dead:,}; after start-up " in summary, text
    assert re.search(r"; after start-up [\d,]+ records in \d+ epochs, [\d.]+ s: [\d,]+ rec/s$", summary), summary
    committed = committed_values(bootstrap, sink)
    assert sum(committed.values()) == out and set(committed) <= set(good) and max(committed.values()) == 1
    assert 0 < dead <= poison


SCRIPT = """
import json, os, signal, sys
from eos.sparksession import build_spark

spark = build_spark("eos-stderr-test", master="local[1]")
from pyspark import SparkContext
jvm_pid = SparkContext._gateway.proc.pid
err = SparkContext._jvm.java.lang.System.err
err.println("from the JVM: kept")
err.println("WARNING: Using incubator modules: jdk.incubator.vector")
err.println("from the JVM: kept too")
err.flush()

def holders(inode):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == inode:
                    flags = int(open(f"/proc/{pid}/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
                    found.append([int(pid), "read" if flags & 3 == 0 else "write"])
        except OSError:
            pass
    return found

inode = os.readlink(f"/proc/{jvm_pid}/fd/2")
print(json.dumps({"jvm": jvm_pid, "me": os.getpid(), "stderr": inode, "holders": holders(inode)}), flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_jvm_stderr_filter_drops_only_known_lines_and_never_outlives_the_driver(tmp_path):
    """A JVM eos starts writes to a pipe that only the driver reads: what it writes arrives but
    the known unactionable line; and once the driver is killed (kill -9), no process holds the
    pipe's read end, so the JVM cannot block on it and exits as it always did."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("EOS_SPARK_LOG", None)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    facts = json.loads(proc.stdout.readline() or "{}")
    assert facts, proc.stderr.read() if proc.stderr else ""
    assert facts["stderr"].startswith("pipe:"), facts
    readers = [pid for pid, mode in facts["holders"] if mode == "read"]
    assert readers == [facts["me"]], facts  # the driver alone reads the JVM's stderr
    assert facts["jvm"] in {pid for pid, mode in facts["holders"] if mode == "write"}, facts
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(60) == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while Path(f"/proc/{facts['jvm']}").exists() and _state(facts["jvm"]) != "Z":
        assert time.monotonic() < deadline, "the JVM outlived its driver by a minute"
        time.sleep(0.2)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "from the JVM: kept\nfrom the JVM: kept too\n" in stderr, stderr
    assert "incubator" not in stderr, stderr


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_eos_v_shows_every_line_of_the_jvm(tmp_path):
    """`eos -v` (EOS_SPARK_LOG=verbose): no filter, the JVM writes to the driver's stderr itself."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "EOS_SPARK_LOG": "verbose"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    facts = json.loads(proc.stdout.readline() or "{}")
    assert facts and [facts["me"], "read"] not in facts["holders"], facts
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(60) == -signal.SIGKILL
    stderr = proc.stderr.read()  # ends when the JVM, which holds it, has exited
    assert "WARNING: Using incubator modules: jdk.incubator.vector\n" in stderr, stderr
    assert "from the JVM: kept\n" in stderr and "from the JVM: kept too\n" in stderr, stderr

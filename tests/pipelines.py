"""Running real pipelines in tests: write a pipeline file, feed input, run it (in this process on
the session's SparkSession, or as an `eos run` subprocess when it must be killed), read output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eos.config import load_pipeline
from eos.runner import RunOptions, RunResult, run_config
from eos_connectors.kafka.clients import producer
from eos_ops.verify import read_topic

ROOT = Path(__file__).resolve().parent.parent


def write_pipeline(folder: Path, config: dict[str, Any], name: str = "pipeline.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def passthrough_pipeline(
    name: str,
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    checkpoint: Path,
    *,
    slots: int = 2,
    mode: str = "exactly-once",
    max_records_per_epoch: int | None = 500,
    sql: str | None = None,
    **epochs: Any,
) -> dict[str, Any]:
    """A pipeline that copies string records (optionally through SQL over the view `events`)."""
    kafka_source: dict[str, Any] = {"bootstrap": bootstrap, "topics": [input_topic]}
    if max_records_per_epoch:
        kafka_source["max_records_per_epoch"] = max_records_per_epoch
    config: dict[str, Any] = {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"mode": mode, "trigger": "available-now", "slots": slots, "timeout": "60s", **epochs},
        "sources": [{"name": "events", "kafka": kafka_source, "key_format": "string", "value_format": "string"}],
        "sinks": [
            {
                "name": "out",
                "kafka": {"bootstrap": bootstrap, "topic": output_topic},
                "key": "key",
                "value": "value",
                "value_format": "string",
            }
        ],
    }
    if sql:
        config["transforms"] = [{"name": "mapped", "sql": textwrap.dedent(sql)}]
    return config


def fence_and_read_ledger(path: Path) -> dict:
    """What recovery does before reading the ledger (fence every transactional id of the stopped
    pipeline, resolve prepared transactions), then the ledger: for tests that inspect it while a
    pre-committed transaction may still hold the ledger topic's last stable offset."""
    from eos.declared import connectors, pipeline_info
    from eos.protocol import recovery
    from eos.protocol.checkpoint import Checkpoint

    config = load_pipeline(path)
    checkpoint = Checkpoint(config.checkpoint_path(path.parent))
    meta = checkpoint.read_meta()
    assert meta is not None, f"{checkpoint.uri} has no eos metadata"
    found = connectors(config, pipeline_info(config, meta.checkpoint_id, path.parent))
    control = found.sources[0].control_log()
    try:
        state = control.state()
        report = recovery.recover(found.sinks, state.pools, state.decision, checkpoint, meta.checkpoint_id, 60, "test")
    finally:
        control.close()
    return report.ledger


def produce_numbered(bootstrap: str, topic: str, start: int, count: int, keys: int = 97) -> list[str]:
    """Records 'rec-<i>' with keys 'k<i % keys>'; returns the values written."""
    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    values = [f"rec-{i}" for i in range(start, start + count)]
    for i, value in zip(range(start, start + count), values, strict=True):
        out.produce(topic, value.encode(), f"k{i % keys}".encode())
    assert out.flush(30) == 0
    return values


def run_in_process(spark, path: Path, **options: Any) -> RunResult:
    """Run a pipeline file on the test SparkSession (a new session of it) until done."""
    options.setdefault("progress", False)
    options.setdefault("install_signal_handlers", False)
    return run_config(load_pipeline(path), path.parent, RunOptions(spark=spark, **options))


@dataclass
class Finished:
    returncode: int
    output: str

    @property
    def killed(self) -> bool:
        return self.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


def eos_subprocess(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Finished:
    """`eos ARGS` in a new process group (a failpoint's kill -9 takes only that group)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYSPARK_PYTHON", sys.executable)
    proc = subprocess.Popen(
        [sys.executable, "-m", "eos", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd or ROOT,
        env=full_env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"eos {' '.join(args)} did not finish within {timeout} s:\n{output[-4000:]}") from None
    _reap_group(proc.pid)
    return Finished(proc.returncode, output)


def _reap_group(pgid: int) -> None:
    """After a kill -9, Spark's Python workers (their own process group) may linger a moment."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def committed_values(bootstrap: str, topic: str) -> Counter[str]:
    return Counter(r.value.decode() for r in read_topic(bootstrap, topic, read_committed=True))


def all_values(bootstrap: str, topic: str) -> Counter[str]:
    """What a read_uncommitted reader sees: committed plus aborted records."""
    return Counter(r.value.decode() for r in read_topic(bootstrap, topic, read_committed=False))


def assert_exactly_once(expected: Counter[str] | list[str], seen: Counter[str]) -> None:
    expected = Counter(expected)
    lost = expected - seen
    duplicated = seen - expected
    assert not lost and not duplicated, (
        f"lost {sum(lost.values())} (e.g. {list(lost)[:5]}), "
        f"duplicated or unexpected {sum(duplicated.values())} (e.g. {list(duplicated)[:5]})"
    )

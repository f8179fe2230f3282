"""`eos init`'s starter pipeline is a pipeline: it validates, passes `eos check` against a real
broker once its input topic exists, and runs, summing JSON events per kind, a record that is not
such JSON in its dead-letter topic. Also run from an installed wheel (test_wheel.py)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Producer

from eos.cli import main
from eos_connectors.kafka.clients import create_topic
from eos_ops.verify import read_topic
from tests.pipelines import eos_subprocess, run_in_process

EVENTS = [{"id": f"e{i}", "kind": "abc"[i % 3], "amount": 0.5 * i} for i in range(30)]
POISON = b"{not json"


def produce_events(bootstrap: str, topic: str) -> None:
    """Events of the starter's schema ("id STRING, kind STRING, amount DOUBLE") and one poison record."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for event in EVENTS:
        producer.produce(topic, json.dumps(event).encode(), event["id"].encode())
    producer.produce(topic, POISON, b"poison")
    assert producer.flush(30) == 0


def expected_totals() -> dict[str, dict]:
    totals: dict[str, dict] = defaultdict(lambda: {"amount": 0.0, "events": 0})
    for event in EVENTS:
        totals[event["kind"]]["amount"] += event["amount"]
        totals[event["kind"]]["events"] += 1
    return {kind: {"kind": kind, **total} for kind, total in totals.items()}


def assert_starter_output(bootstrap: str, output: str, dlq: str) -> None:
    """The last total per kind (update mode: each epoch writes the kinds it changed) is the sum of
    the events, and the poison record is in the dead-letter topic, once."""
    last = {r.key.decode(): json.loads(r.value) for r in read_topic(bootstrap, output)}
    assert last == expected_totals()
    assert [r.value for r in read_topic(bootstrap, dlq)] == [POISON]


def test_the_starter_validates_checks_and_runs(tmp_path: Path, bootstrap, admin, spark, unique_name, monkeypatch):
    name = unique_name("starter")
    topic, output = f"{name}-in", f"{name}-out"
    path = tmp_path / "pipeline.yaml"
    assert main(["init", str(path), "--name", name, "--input", topic, "--output", output]) == 0
    assert main(["validate", str(path)]) == 0

    env = {"BROKERS": bootstrap}
    missing = eos_subprocess("check", "--no-spark", str(path), env=env, cwd=tmp_path, timeout=120)
    assert missing.returncode != 0 and f"topic '{topic}' does not exist" in missing.output, missing.output[-2000:]
    assert create_topic(admin, topic, 2)
    checked = eos_subprocess("check", "--no-spark", str(path), env=env, cwd=tmp_path, timeout=120)
    assert checked.returncode == 0 and "ready to run" in checked.output, checked.output[-2000:]

    produce_events(bootstrap, topic)
    monkeypatch.setenv("BROKERS", bootstrap)
    result = run_in_process(spark, path, trigger="available-now")
    assert result.epochs_committed >= 1 and result.stopped_by == "finished", result
    assert_starter_output(bootstrap, output, f"{topic}-dlq")

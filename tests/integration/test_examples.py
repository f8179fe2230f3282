"""Every pipeline the README and the docs show is a file under examples/, and runs: the README's
example runs end to end (`eos run`, then `eos verify` says EXACTLY ONCE), the Python API's example
runs as a program of its own, and every example file validates."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from eos_connectors.kafka.clients import admin_client, create_topic
from tests.pipelines import ROOT, eos_subprocess

EXAMPLES = ROOT / "examples"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ORDERS = [
    {"order_id": f"o{i}", "country": "DEFRUS"[2 * (i % 3) : 2 * (i % 3) + 2], "amount": 1.25 * (i % 7),
     "status": "paid" if i % 4 else "open"}
    for i in range(300)
]  # fmt: skip


def pipelines_shown(text: str) -> list[str]:
    """The YAML blocks of a Markdown text that are whole pipelines (they start with `name:`)."""
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [b for b in blocks if re.match(r"(\s*#.*\n)*\s*name:", b)]


def test_every_pipeline_shown_in_the_docs_is_an_example_file():
    files = {path.name: path.read_text() for path in EXAMPLES.glob("*.yaml")}
    shown = [(doc.name, block) for doc in DOCS for block in pipelines_shown(doc.read_text())]
    assert shown, "the README shows no pipeline"
    for doc, block in shown:
        matches = [name for name, text in files.items() if block.strip() in text]
        assert matches, f"{doc} shows a pipeline that is not (a part of) a file under examples/:\n{block[:400]}"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_file_validates(example):
    env = {"PG_DSN": "host=db dbname=shop user=eos", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
           "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}  # fmt: skip
    finished = eos_subprocess("validate", str(EXAMPLES / example), env=env, timeout=120)
    assert finished.returncode == 0, finished.output[-3000:]
    assert f"{EXAMPLES / example}: valid" in finished.output


@pytest.fixture(scope="module")
def orders_topic(bootstrap):
    """The examples' input topic `orders`: JSON orders and one record that is not such JSON."""
    from confluent_kafka import Producer

    assert create_topic(admin_client({"bootstrap.servers": bootstrap}), "orders", 2), "topic orders already existed"
    producer = Producer({"bootstrap.servers": bootstrap})
    for order in ORDERS:
        producer.produce("orders", json.dumps(order).encode(), order["order_id"].encode())
    producer.produce("orders", b"{not json", b"poison")
    assert producer.flush(30) == 0
    return "orders"


def expected_totals() -> dict[str, tuple[float, int]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for order in ORDERS:
        if order["status"] == "paid":
            totals[order["country"]][0] += order["amount"]
            totals[order["country"]][1] += 1
    return {country: (total, n) for country, (total, n) in totals.items()}


def table_totals(dsn: str, table: str) -> dict[str, tuple[float, int]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return {c: (t, n) for c, t, n in conn.execute(f"SELECT country, total, orders FROM {table}").fetchall()}


def test_the_readme_example_runs_and_verifies_exactly_once(orders_topic, bootstrap, postgres, tmp_path):
    path = tmp_path / "orders.yaml"
    shutil.copy(EXAMPLES / "orders.yaml", path)
    env = {"BROKERS": bootstrap, "PG_DSN": postgres}
    ran = eos_subprocess("run", str(path), "--trigger", "available-now", env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.output[-3000:]
    verified = eos_subprocess("verify", str(path), env=env, cwd=tmp_path, timeout=300)
    assert verified.returncode == 0 and "EXACTLY ONCE" in verified.output, verified.output[-3000:]
    got = table_totals(postgres, "totals_by_country")
    assert got.keys() == expected_totals().keys()
    for country, (total, n) in expected_totals().items():
        assert got[country][1] == n and abs(got[country][0] - total) < 1e-9


def test_the_python_api_example_runs_as_a_program(orders_topic, bootstrap, postgres, tmp_path):
    env = {**os.environ, "BROKERS": bootstrap, "PG_DSN": postgres, "PYSPARK_PYTHON": sys.executable}
    finished = subprocess.run(
        [sys.executable, str(EXAMPLES / "orders_api.py"), "--available-now", "--checkpoint", str(tmp_path / "ck")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
    assert "epochs committed" in finished.stdout
    got = table_totals(postgres, "totals_by_country_api")
    for country, (total, n) in expected_totals().items():
        assert got[country][1] == n and abs(got[country][0] - total) < 1e-9

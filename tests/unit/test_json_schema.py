"""The pipeline file's JSON Schema (`eos schema`, for editors): a valid JSON Schema that accepts what
eos accepts (every example, the `eos init` starter, durations with units, format and registry
shorthands, `${VAR}` references) and rejects what eos rejects; the committed copy is current."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from eos.cli import main
from eos.commands.init import json_schema
from eos.config import parse_pipeline
from eos.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "pipeline.schema.json"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

BASE: dict[str, Any] = {
    "name": "p1",
    "checkpoint": "./ck",
    "sources": [{"name": "events", "kafka": {"bootstrap": "b:9092", "topics": ["in"]}}],
    "sinks": [{"name": "out", "kafka": {"bootstrap": "b:9092", "topic": "out"}}],
}


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(json_schema())
    Draft202012Validator.check_schema(schema)  # raises SchemaError, naming the part that is not JSON Schema
    return Draft202012Validator(schema)


def problems(validator: Draft202012Validator, document: Any) -> list[str]:
    errors = validator.iter_errors(document)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:300]}" for e in errors]


def changed(path: str, value: Any) -> dict[str, Any]:
    """BASE with the value at a dotted path (list indexes as numbers) set."""
    document = copy.deepcopy(BASE)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = document
    for part in parents:
        node = node[part] if isinstance(part, int) or part in node else node.setdefault(part, {})
    node[last] = value
    return document


def eos_accepts(document: dict[str, Any]) -> bool:
    try:
        parse_pipeline(yaml.safe_dump(document), env={})
    except ConfigError:
        return False
    return True


def test_the_schema_is_json_schema_2020_12(validator):
    assert validator.schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert not problems(validator, BASE)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_schema_accepts_every_example(validator, example):
    # As an editor reads the file: before `${VAR}` references are filled in.
    assert not problems(validator, yaml.safe_load(example.read_text()))


def test_the_schema_accepts_the_starter_that_eos_init_writes(validator, tmp_path):
    assert main(["init", str(tmp_path / "my_pipeline.yaml")]) == 0
    written = yaml.safe_load((tmp_path / "my_pipeline.yaml").read_text())
    assert not problems(validator, written)
    # The schema written beside it, which its first line points editors at, is this one.
    assert "$schema=pipeline.schema.json" in (tmp_path / "my_pipeline.yaml").read_text().splitlines()[0]
    assert json.loads((tmp_path / "pipeline.schema.json").read_text()) == validator.schema


# What eos accepts, each also accepted by the schema (and checked against eos's own parser, so the
# two cannot drift apart unnoticed).
ACCEPTED = [
    ("epochs.timeout", "2m"),
    ("epochs.timeout", "500ms"),
    ("epochs.timeout", "1 minute"),
    ("epochs.timeout", "1.5 H"),
    ("epochs.timeout", " 10 Seconds "),
    ("epochs.timeout", 3),
    ("epochs.min_pause", 0.25),
    ("sources.0.watermark", {"column": "ts", "delay": "30s"}),
    ("sources.0.key_format", "string"),
    ("sources.0.value_format", {"type": "json", "schema": "id STRING, amount DOUBLE"}),
    ("sources.0.value_format", {"type": "avro", "registry": "http://registry:8081"}),
    ("sinks.0.value_format", "json"),
    ("sinks.0.kafka.config", {"linger.ms": 5, "enable.idempotence": True, "compression.type": "lz4"}),
    ("metrics", {"port": "${METRICS_PORT:-9464}"}),
    ("epochs.slots", "${SLOTS:-2}"),
    ("epochs.output_mode", "${OUTPUT_MODE:-update}"),
    ("sinks.0.kafka.create_topic", "${CREATE_TOPIC:-true}"),
]

# What eos rejects, each also rejected by the schema.
REJECTED = [
    ("nmae", "p1"),  # an unknown top-level field
    ("sinks.0.kafka.topik", "out"),  # an unknown field in a connector's section
    ("sources.0.kafka.isolation", "serializable"),  # a wrong enum value
    ("epochs.output_mode", "upsert"),
    ("epochs.mode", "exactly_once"),
    ("epochs.timeout", "2 fortnights"),
    ("epochs.timeout", "-1s"),
    ("epochs.timeout", "10"),  # a number in quotes has no unit
    ("epochs.timeout", True),
    ("sources.0.value_format", "xml"),
    ("sinks.0.value_format", {"type": "json", "compression": "gzip"}),
    ("sinks", []),
    ("name", "two words"),
]


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[f"{p}={v}" for p, v in ACCEPTED])
def test_the_schema_accepts_what_eos_accepts(validator, path, value):
    document = changed(path, value)
    assert eos_accepts(document), "eos itself rejects this document: the case is wrong"
    assert not problems(validator, document)


@pytest.mark.parametrize(("path", "value"), REJECTED, ids=[f"{p}={v}" for p, v in REJECTED])
def test_the_schema_rejects_what_eos_rejects(validator, path, value):
    document = changed(path, value)
    assert not eos_accepts(document), "eos itself accepts this document: the case is wrong"
    assert problems(validator, document)


def test_the_committed_schema_is_current():
    assert COMMITTED.exists() and COMMITTED.read_text() == json_schema(), (
        f"{COMMITTED.relative_to(ROOT)} is not what eos generates: regenerate it with "
        f"`eos schema -o {COMMITTED.relative_to(ROOT)}` and commit it"
    )

"""`eos init`: a starter pipeline file (and `eos schema`: the pipeline file's JSON Schema, for editors)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

TITLE = "eos pipeline file"
STARTER = """\
# yaml-language-server: $schema={schema}
# A pipeline: Kafka topic(s) -> SQL -> a Kafka topic, every record exactly once.
# Check it against your systems with `eos check {file}`, run it with `eos run {file}`.
# Every field: docs/PIPELINE.md (formats: docs/FORMATS.md; PostgreSQL sinks: docs/POSTGRES.md).
name: {name}                      # one name per pipeline: its transactional ids, ledger, metrics
checkpoint: ./checkpoints/{name}  # Spark's checkpoint and eos's metadata (local, hdfs://, s3a://)
epochs:
  trigger: 1s                     # an epoch per second; or available-now: drain the input, then stop
  output_mode: update             # each epoch writes the groups it changed (append: for windows with a watermark)
sources:
  - name: events                  # the SQL view
    kafka:
      bootstrap: ${{BROKERS:-127.0.0.1:9092}}
      topics: [{input}]
    value_format:                 # raw | string | json | csv | avro
      type: json
      schema: "id STRING, kind STRING, amount DOUBLE"   # a Spark DDL string, or an .avsc file
    on_error: dlq                 # a record that cannot be decoded: fail | skip | dlq
    dlq_topic: {input}-dlq
transforms:
  - name: totals
    sql: |
      SELECT kind, sum(amount) AS amount, count(*) AS events
      FROM events
      GROUP BY kind
sinks:
  - name: out
    kafka:
      bootstrap: ${{BROKERS:-127.0.0.1:9092}}
      topic: {output}
      create_topic: true
    key: kind                     # a SQL expression over the transform's columns
    value_format: json            # the value: every column, as JSON
"""


def cmd_init(args: argparse.Namespace) -> int:
    from eos.config import pipeline_from_yaml
    from eos.errors import ConfigError
    from eos.yamlsource import parse_yaml

    target: Path = args.file
    if target.exists() and not args.force:
        raise ConfigError(f"{target} exists; choose another file name, or --force to overwrite it")
    if not target.parent.is_dir():
        raise ConfigError(f"{target.parent} is not a folder; create it first")
    # A pipeline's name takes letters, digits, '.', '_', '-' (eos.model.NAME): the file's name made one.
    name = args.name or re.sub(r"[^A-Za-z0-9.-]+", "-", target.stem).strip("-.") or "pipeline"
    schema_file = target.parent / "pipeline.schema.json"
    shown = shlex.quote(str(target))
    text = STARTER.format(name=name, file=shown, input=args.input, output=args.output, schema=schema_file.name)
    try:  # what is written validates: a --name or topic eos cannot take is refused here
        pipeline_from_yaml(parse_yaml(text, str(target), env={}))
    except ConfigError as error:
        raise ConfigError(
            f"the starter with these names would not be a valid pipeline: {error.message}",
            hint="names and topics take letters, digits, '.', '_' and '-'",
        ) from None
    if schema_file.exists() and not args.force and not _is_eos_schema(schema_file):
        raise ConfigError(f"{schema_file} exists and is not eos's; move it, or --force to overwrite it")
    target.write_text(text)
    schema_file.write_text(json_schema())
    print(f"wrote {target} (and {schema_file}, for editors)")
    print(f"check it with `eos check {shown}`, run it with `eos run {shown}`")
    return 0


def _is_eos_schema(path: Path) -> bool:
    """Whether `path` is a schema `eos init` or `eos schema` wrote (another pipeline's, say)."""
    try:
        return json.loads(path.read_text()).get("title") == TITLE
    except (OSError, ValueError, AttributeError):
        return False


def json_schema() -> str:
    """The pipeline file's JSON Schema: what its YAML accepts, as an editor reads it (before `${VAR}`
    references are filled in from the environment)."""
    from eos.config import pipeline_model
    from eos.yamlsource import _ENV  # the one definition of a `${VAR}` / `${VAR:-default}` reference

    schema = pipeline_model().model_json_schema(by_alias=True)
    schema = _with_env_references(schema)
    schema["$defs"]["EnvValue"] = {
        "type": "string",
        "pattern": f"^{_ENV.pattern}$",
        "description": "${VAR} or ${VAR:-default}: a number or boolean taken from the environment",
    }
    schema["$defs"]["EnvText"] = {
        "type": "string",
        "pattern": _ENV.pattern,
        "description": "text with ${VAR} or ${VAR:-default} references, filled in from the environment",
    }
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = TITLE
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


# Not schemas but values: left as they are.
_VALUES = ("default", "enum", "const", "examples")
# Moved from a value's schema to the anyOf that wraps it.
_ANNOTATIONS = ("default", "description", "title")


def _with_env_references(node: Any) -> Any:
    """`node` where every value a `${VAR}` reference could stand for also takes one: a number or
    boolean a whole reference (eos reads what it holds as YAML), a string the schema constrains
    (pattern, enum) any text with one. Other strings take one already."""
    if isinstance(node, list):
        return [_with_env_references(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: value if key in _VALUES else _with_env_references(value) for key, value in node.items()}
    if "anyOf" in node:  # an alternative that is itself only alternatives joins them (once each)
        flat = [part for item in node["anyOf"] for part in (item["anyOf"] if set(item) == {"anyOf"} else [item])]
        node["anyOf"] = [item for i, item in enumerate(flat) if item not in flat[:i]]
    kind = node.get("type")
    if kind in ("integer", "number", "boolean"):
        reference = "EnvValue"
    elif kind == "string" and any(key in node for key in ("pattern", "enum", "const")):
        reference = "EnvText"
    else:
        return node
    inner = {key: value for key, value in node.items() if key not in _ANNOTATIONS}
    outer = {key: value for key, value in node.items() if key in _ANNOTATIONS}
    return {"anyOf": [inner, {"$ref": f"#/$defs/{reference}"}], **outer}


def cmd_schema(args: argparse.Namespace) -> int:
    text = json_schema()
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser(
        "init",
        help="write a starter pipeline file",
        description="Write a starter pipeline (a Kafka topic of JSON events -> SQL -> a Kafka topic, with a "
        "dead-letter queue) to edit: every field is commented. `eos schema` prints the JSON Schema editors use.",
    )
    init.add_argument("file", type=Path, nargs="?", default=Path("pipeline.yaml"), help="(default pipeline.yaml)")
    init.add_argument("--name", help="the pipeline's name (default: the file's name)")
    init.add_argument("--input", default="events", help="the input topic (default events)")
    init.add_argument("--output", default="events-totals", help="the output topic (default events-totals)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(func=cmd_init)

    schema = sub.add_parser(
        "schema",
        help="print the pipeline file's JSON Schema (for editors: yaml-language-server, VS Code, IntelliJ)",
        description="The JSON Schema of a pipeline file, generated from eos's own config models (with the installed "
        "connectors' sections).",
    )
    schema.add_argument("-o", "--output", type=Path, help="write it to this file instead of stdout")
    schema.set_defaults(func=cmd_schema)

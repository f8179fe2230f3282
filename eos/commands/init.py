"""`eos init`: a starter pipeline file (and `eos schema`: the pipeline file's JSON Schema, for editors)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STARTER = """\
# yaml-language-server: $schema={schema}
# A pipeline: Kafka topic(s) -> SQL -> a Kafka topic, every record exactly once.
# Check it against your systems with `eos check {file}`, run it with `eos run {file}`.
# Every field: README.md ("A pipeline"), docs/FORMATS.md, docs/POSTGRES.md.
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
    value_format:                 # raw | string | json | avro
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
    from eos.errors import ConfigError

    target: Path = args.file
    if target.exists() and not args.force:
        raise ConfigError(f"{target} exists; choose another file name, or --force to overwrite it")
    name = args.name or target.stem.replace("_", "-")
    schema_file = target.parent / "pipeline.schema.json"
    text = STARTER.format(name=name, file=target, input=args.input, output=args.output, schema=schema_file.name)
    target.write_text(text)
    schema_file.write_text(json_schema())
    print(f"wrote {target} (and {schema_file}, for editors)")
    print(f"check it with `eos check {target}`, run it with `eos run {target}`")
    return 0


def json_schema() -> str:
    from eos.config import pipeline_model

    schema = pipeline_model().model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "eos pipeline file"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


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

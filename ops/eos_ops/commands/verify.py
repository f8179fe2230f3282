"""`eos verify`: check that an output topic or table holds exactly the input's effect, once."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def cmd_verify(args: argparse.Namespace) -> int:
    from eos.errors import ConfigError
    from eos_ops.verify import Decoder, Match, VerifySpec, load_spec, verify

    dsn = args.dsn or os.environ.get("EOS_PG_DSN")
    if args.spec:
        spec = load_spec(args.spec, bootstrap=args.bootstrap, dsn=dsn)
    else:
        if not (args.bootstrap and args.input and (args.output or args.output_table)):
            raise ConfigError("give --spec FILE, or --bootstrap, --input and --output (or --output-table with --dsn)")
        spec = VerifySpec(
            bootstrap=args.bootstrap,
            input_topic=args.input,
            output_topic=args.output or "",
            input_decoder=Decoder(args.input_format, args.input_schema),
            output_decoder=Decoder(args.output_format, args.output_schema),
            match=Match(args.id, args.output_id or args.id, args.output_id_regex),
            output_table=args.output_table,
            dsn=dsn,
            where=args.where,
        )
    report = verify(spec)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True, default=str))
    else:
        print(f"eos verify: {spec.input_topic} -> {spec.output} @ {spec.bootstrap}")
        for line in report.lines():
            print(line)
    return 0 if report.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    verify = sub.add_parser(
        "verify",
        help="check exactly-once on real topics and tables: lost, duplicated, unexpected records",
        description="Read the input and the committed output (read_committed, or a PostgreSQL table) and check them "
        "against a relation: every input id exactly once in the output (--id), or totals recomputed from the input "
        "(--spec with an aggregate). Also reports the aborted records a read_uncommitted reader sees (a table: the "
        "prepared transactions waiting in its database). Exit 1 on any problem.",
    )
    verify.add_argument("--spec", type=Path, help="a YAML verify spec (needed for aggregates)")
    verify.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides the spec's)")
    verify.add_argument("--input", help="input topic")
    verify.add_argument("--output", help="output topic")
    verify.add_argument(
        "--output-table", help="output PostgreSQL table (optionally schema-qualified), instead of a topic"
    )
    verify.add_argument("--dsn", help="the output table's database, a libpq string (default $EOS_PG_DSN; PG* "
                        "environment variables such as PGPASSWORD apply)")  # fmt: skip
    verify.add_argument("--where", help="an SQL condition selecting the table rows to check")
    verify.add_argument("--id", default="value", help="input id: 'value', 'key' or a field of the record (value)")
    verify.add_argument("--output-id", help="output id (default: same as --id); for a table, a column")
    verify.add_argument("--output-id-regex", help="extract the input id from the output id (group 1)")
    for side in ("input", "output"):
        verify.add_argument(f"--{side}-format", default="string", choices=["raw", "string", "json", "avro"],
                            help=f"how {side} values are encoded (string)")  # fmt: skip
        verify.add_argument(f"--{side}-schema", help=f"Avro schema (.avsc) of the {side} values")
    verify.add_argument("--json", action="store_true", help="machine-readable report")
    verify.set_defaults(func=cmd_verify)

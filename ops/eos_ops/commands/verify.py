"""`eos verify`: check that the outputs hold exactly the input's effect, once: every sink and DLQ
of a pipeline file, or one output against a relation (a spec file, or --input/--output)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def _client_config(path: Path | None) -> dict[str, Any]:
    """librdkafka settings from a YAML mapping (`${VAR}` for secrets: never on the command line)."""
    from eos.errors import ConfigError
    from eos.yamlsource import load_yaml

    if path is None:
        return {}
    data = load_yaml(path).data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a Kafka client config is a mapping of librdkafka settings")
    return {str(k): v for k, v in data.items()}


def cmd_verify(args: argparse.Namespace) -> int:
    from eos.errors import ConfigError
    from eos_ops.verify import Decoder, Match, VerifySpec, load_spec, verify
    from eos_ops.verify_compare import Tolerance

    tolerance = Tolerance(args.rel_tol, args.abs_tol)
    if args.pipeline is not None:
        if args.spec or args.input or args.output or args.output_table or args.bootstrap or args.kafka_config:
            raise ConfigError("give a pipeline file alone: it names every topic, table and client setting")
        from eos_ops.verify_pipeline import verify_pipeline

        pipeline_report = verify_pipeline(args.pipeline, tolerance)
        if args.json:
            print(json.dumps(pipeline_report.to_json(), indent=2, sort_keys=True, default=str))
        else:
            for line in pipeline_report.lines():
                print(line)
        return 0 if pipeline_report.ok else 1
    dsn = args.dsn or os.environ.get("EOS_PG_DSN")
    if args.spec:
        spec = load_spec(args.spec, bootstrap=args.bootstrap, dsn=dsn, tolerance=tolerance if args.tolerance else None)
        spec.client.update(_client_config(args.kafka_config))
    else:
        if not (args.bootstrap and args.input and (args.output or args.output_table)):
            raise ConfigError(
                "give a pipeline file (eos verify PIPELINE.yaml), --spec FILE, or --bootstrap, --input and --output "
                "(or --output-table with --dsn)"
            )
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
            client=_client_config(args.kafka_config),
            tolerance=tolerance,
        )
    report = verify(spec)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True, default=str))
    else:
        print(f"eos verify: {spec.input_topic} -> {spec.output} @ {spec.bootstrap}")
        for line in report.lines():
            print(line)
    return 0 if report.ok else 1


class _Tolerance(argparse.Action):
    """Stores the value and notes that a tolerance was given (it then overrides a spec's)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, value: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, value)
        namespace.tolerance = True


def register(sub: argparse._SubParsersAction) -> None:
    verify = sub.add_parser(
        "verify",
        help="check exactly-once on real topics and tables: lost, duplicated, unexpected and wrong records",
        description="Read the input and the committed output (read_committed, or a PostgreSQL table) and check that "
        "the output holds the input's effect exactly once. With a pipeline file: every sink and dead-letter queue of "
        "the pipeline, the expected output computed by running its transforms as a batch Spark query over the "
        "input. Otherwise one output, against a relation: every input id exactly once (--id), or totals recomputed "
        "from the input (--spec with an aggregate). Also reports the aborted records a read_uncommitted reader sees "
        "(a table: the prepared transactions waiting in its database). Exit 1 on any problem. docs/VERIFY.md.",
    )
    verify.add_argument("pipeline", nargs="?", type=Path, help="a pipeline file: check all its outputs")
    verify.add_argument("--spec", type=Path, help="a YAML verify spec (docs/VERIFY.md)")
    verify.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides the spec's)")
    verify.add_argument("--kafka-config", type=Path, metavar="FILE",
                        help="a YAML mapping of librdkafka settings for every Kafka client (SASL, SSL; ${VAR} for "
                        "secrets), with --spec or --input/--output")  # fmt: skip
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
    verify.add_argument("--rel-tol", type=float, default=1e-9, action=_Tolerance,
                        help="floats are equal within this relative tolerance (1e-9)")  # fmt: skip
    verify.add_argument("--abs-tol", type=float, default=1e-9, action=_Tolerance,
                        help="... or within this absolute difference (1e-9)")  # fmt: skip
    verify.add_argument("--json", action="store_true", help="machine-readable report")
    verify.set_defaults(func=cmd_verify, tolerance=False)

"""`eos acls PIPELINE.yaml`: the Kafka ACLs a pipeline needs, as kafka-acls.sh commands or JSON
(eos_connectors.kafka.acls computes them from the file; nothing is asked of Kafka unless --check)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_principals(values: list[str], names: set[str]) -> dict[str, str]:
    """`--principal User:x` (every client) or `--principal NAME=User:x` (the source or sink NAME;
    a source's dead-letter queue and, for the first source, the control log share its client)."""
    from eos.errors import ConfigError

    given: dict[str, str] = {}
    for value in values:
        name, sep, principal = value.partition("=")
        if not sep or ":" in name:  # a principal for all (it may hold "=": User:CN=a,O=b)
            name, principal = "*", value
        if name != "*" and name not in names:
            raise ConfigError(f"--principal {value}: the pipeline has no source or sink named {name!r}")
        if ":" not in principal:
            raise ConfigError(f"--principal {value}: a principal is TYPE:NAME, e.g. User:alice")
        given[name] = principal
    return given


def cmd_acls(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.errors import ConfigError
    from eos_connectors.kafka import acls

    config = load_pipeline(args.pipeline)
    names = {entry.name for entry in [*config.sources, *config.sinks]}
    principals = parse_principals(args.principal or [], names)
    commands = args.commands.split(",") if args.commands else list(acls.COMMANDS)
    unknown = [c for c in commands if c not in acls.COMMANDS]
    if unknown:
        raise ConfigError(f"--for {args.commands}: unknown command {unknown[0]!r} (one of {', '.join(acls.COMMANDS)})")
    try:
        needs = acls.pipeline_needs(config, principals)
    except acls.UnknownPrincipal as exc:
        raise ConfigError(str(exc)) from None
    entries = acls.merge(needs, commands)
    if args.check:
        from eos_connectors.kafka.access import check_pipeline, explain

        found = check_pipeline(config, args.pipeline.resolve().parent)
        if found.missing:
            refused = explain(found.missing, then="eos run would stop at its start")
            print(f"eos acls --check: {refused}", file=sys.stderr)
            return 1
        unchecked = sorted({f"{n.acl.describe()} ({n.acl.principal})" for n in found.deferred})
        if unchecked:
            print("eos acls --check: not asked (the topics do not exist yet; eos run asks once it created them): "
                  + "; ".join(unchecked), file=sys.stderr)  # fmt: skip
        print(f"eos acls --check: every ACL eos run needs is granted ({config.name})", file=sys.stderr)
        return 0
    if args.json:
        print(acls.to_json(config.name, entries))
    else:
        print("\n".join(acls.render(config.name, entries, args.command_config)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "acls",
        help="print the Kafka ACLs a pipeline needs (kafka-acls.sh commands or JSON), each with why",
        description="Compute from the pipeline file the Kafka ACLs each of its clients needs (topics, consumer "
        "groups, transactional-id prefixes, cluster operations), per principal, each with the calls that need it "
        "and the commands that make them (eos run, eos status, eos reset); optional ones are marked. The principal "
        "of a SASL PLAIN/SCRAM client is User:<sasl.username>; for GSSAPI, OAUTHBEARER and TLS client "
        "certificates eos cannot know it: give --principal. --check asks the cluster whether each principal has "
        "what eos run needs.",
    )
    parser.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    parser.add_argument("--json", action="store_true", help="print them as JSON")
    parser.add_argument(
        "--principal",
        action="append",
        metavar="[NAME=]PRINCIPAL",
        help="the principal of the source or sink NAME (e.g. events=User:alice), or of every client; repeatable",
    )
    parser.add_argument(
        "--for",
        dest="commands",
        metavar="COMMANDS",
        help="only what these commands need, comma-separated: run, status, reset (default: all)",
    )
    parser.add_argument(
        "--command-config",
        default="admin.properties",
        help="the administrator's properties file the kafka-acls.sh lines name (default: admin.properties)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="ask the cluster, as each client of the pipeline, whether it has every ACL eos run needs; exit 1 and "
        "list what is missing",
    )
    parser.set_defaults(func=cmd_acls)

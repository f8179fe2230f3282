"""The `eos` command line. The core's own subcommands (`run`, `validate`) live in eos/commands/;
the operational tools (status, verify, soak, demo, ...) register theirs as entry points of the
group `eos.commands`, so the core never imports them. Each command module has a
`register(subparsers)` function; heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from importlib.metadata import entry_points

import eos.commands
from eos import __version__
from eos.errors import EosError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eos",
        description="eos: end-to-end exactly-once Kafka pipelines on Apache Spark.",
    )
    parser.add_argument("--version", action="version", version=f"eos {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Kafka client and Spark warnings")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = [f"eos.commands.{m.name}" for m in pkgutil.iter_modules(eos.commands.__path__)]
    modules += [entry.value for entry in entry_points(group="eos.commands")]
    for module in sorted(modules, key=lambda name: name.rsplit(".", 1)[-1]):
        importlib.import_module(module).register(sub)
    return parser


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # librdkafka's warnings are mostly expected retries; its errors are shown.
    logging.getLogger("eos.kafka").setLevel(logging.INFO if verbose else logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    if verbose:
        os.environ.setdefault("EOS_SPARK_LOG", "verbose")
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(py4j_on_root)


def py4j_on_root(record: logging.LogRecord) -> bool:
    """False for what py4j logs on the root logger, not on its own (java_gateway's
    `logging.exception("Exception while sending command.")` when a call's connection fails, as
    at exit once Spark's JVM is gone): the level set for "py4j" misses those, and the caller gets
    the failure as an exception either way."""
    return not (record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except EosError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())

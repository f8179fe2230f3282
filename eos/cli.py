"""The `eos` command line. Every subcommand has --help; heavy imports happen inside handlers."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from eos import __version__
from eos.errors import EosError


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# eos kafka ...
# ---------------------------------------------------------------------------------------------


def _broker(args: argparse.Namespace):
    from eos.localkafka import LocalBroker

    return LocalBroker(port=args.port, data_dir=args.data_dir, heap=getattr(args, "heap", "512m"))


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from eos.localkafka import fetch_jars

    print(fetch_jars(progress=_say))
    return 0


def cmd_kafka_start(args: argparse.Namespace) -> int:
    status = _broker(args).start(timeout=args.timeout, progress=_say)
    print(status.bootstrap)
    return 0


def cmd_kafka_stop(args: argparse.Namespace) -> int:
    _broker(args).stop(kill=args.kill, progress=_say)
    return 0


def cmd_kafka_status(args: argparse.Namespace) -> int:
    status = _broker(args).status()
    if not status.running:
        print(f"not running (data directory {status.data_dir})")
        return 3
    state = f"answering, {status.topics} topics" if status.answering else "NOT answering"
    print(f"running at {status.bootstrap}, pid {status.pid}, {state}; data {status.data_dir}; log {status.log_file}")
    return 0 if status.answering else 1


def _add_kafka(sub: argparse._SubParsersAction) -> None:
    kafka = sub.add_parser(
        "kafka",
        help="manage the embedded local Kafka broker (KRaft, no Docker)",
        description="Manage the embedded local Apache Kafka broker: a single KRaft node on loopback whose "
        "jars are fetched once from Maven Central with ops/kafka/pom.xml.",
    )
    ksub = kafka.add_subparsers(dest="kafka_command", required=True, metavar="{fetch,start,stop,status}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--port", type=int, default=9092, help="client port; the controller uses port+1 (9092)")
        p.add_argument("--data-dir", type=Path, default=None, help="broker data (default $EOS_HOME/broker-PORT)")

    fetch = ksub.add_parser("fetch", help="download the broker jars (done by start if needed)")
    fetch.set_defaults(func=cmd_kafka_fetch)

    start = ksub.add_parser("start", help="start the broker in the background and wait until it answers")
    common(start)
    start.add_argument("--heap", default="512m", help="JVM heap, e.g. 512m or 1g (512m)")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (120)")
    start.set_defaults(func=cmd_kafka_start)

    stop = ksub.add_parser("stop", help="shut the broker down cleanly")
    common(stop)
    stop.add_argument("--kill", action="store_true", help="SIGKILL instead of a clean shutdown")
    stop.set_defaults(func=cmd_kafka_stop)

    status = ksub.add_parser("status", help="is the broker running and answering? (exit 3 if not running)")
    common(status)
    status.set_defaults(func=cmd_kafka_status)


# ---------------------------------------------------------------------------------------------
# eos demo
# ---------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from eos.demo import run_smoke

    return run_smoke(port=args.port)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="start the local broker and run the demo end to end")
    demo.add_argument("--port", type=int, default=9092, help="local broker port (9092)")
    demo.set_defaults(func=cmd_demo)


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eos",
        description="eos: end-to-end exactly-once Kafka pipelines on Apache Spark.",
    )
    parser.add_argument("--version", action="version", version=f"eos {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Kafka client and Spark warnings")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_kafka, _add_demo]


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # librdkafka's warnings are mostly expected retries; its errors are shown.
    logging.getLogger("eos.kafka").setLevel(logging.INFO if verbose else logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING if verbose else logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except EosError as error:
        _say(f"error: {error}")
        return error.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

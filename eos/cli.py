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
# eos run / validate
# ---------------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from eos.runner import RunOptions, run

    options = RunOptions(
        master=args.master,
        trigger=args.trigger,
        failpoints=args.failpoint or [],
        progress=not args.quiet,
    )
    result = run(args.pipeline, options)
    total = sum(result.records_out.values())
    _say(
        f"eos: {result.pipeline} stopped ({result.stopped_by}): {result.epochs_committed} epochs committed, "
        f"{total} records out"
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from eos.config import load_pipeline, redacted
    from eos.runner import describe_plan

    config = load_pipeline(args.pipeline)
    if args.json:
        print(json.dumps(redacted(config), indent=2, sort_keys=True))
    else:
        for line in describe_plan(config):
            print(line)
        print(f"{args.pipeline}: valid")
    return 0


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run a pipeline (Spark local[*] unless --master or spark-submit says otherwise)",
        description="Run a pipeline exactly once. Stops at the end of the input with --trigger available-now, "
        "else on SIGTERM/SIGINT (finishing the current epoch; a second signal aborts it).",
    )
    run.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    run.add_argument("--master", help="Spark master, e.g. local[4] or spark://host:7077")
    run.add_argument("--trigger", help="override epochs.trigger: an interval like 2s, or available-now")
    run.add_argument(
        "--failpoint",
        action="append",
        metavar="SPEC",
        help="arm a failpoint, e.g. sink.after_precommit=kill@epoch=2 (repeatable; see docs)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no per-epoch progress lines")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a pipeline file without running it")
    validate.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    validate.add_argument("--json", action="store_true", help="print the validated config (secrets masked)")
    validate.set_defaults(func=cmd_validate)


# ---------------------------------------------------------------------------------------------
# eos demo
# ---------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from eos.demo import run_demo

    return run_demo(
        port=args.port, external_kafka=args.external_kafka, master=args.master, events=args.events, seed=args.seed
    )


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the ad-attribution demo end to end and check its output",
        description="Start the local broker, write ad impressions and clicks (with duplicates and late "
        "events), run examples/ad_attribution.yaml, and check the per-campaign, per-minute counts it "
        "committed against the generator's ground truth. Exit 1 on any mismatch.",
    )
    demo.add_argument("--port", type=int, default=9092, help="local broker port (9092)")
    demo.add_argument("--external-kafka", action="store_true", help="use $EOS_BOOTSTRAP instead of the local broker")
    demo.add_argument("--master", help="Spark master (default local[*])")
    demo.add_argument("--events", type=int, default=40_000, help="distinct ad events to generate (40000)")
    demo.add_argument("--seed", type=int, default=7, help="generator seed (7)")
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


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_kafka, _add_run, _add_demo]


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

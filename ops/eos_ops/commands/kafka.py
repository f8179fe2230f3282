"""`eos kafka fetch|start|stop|status`: the embedded local broker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _broker(args: argparse.Namespace):
    from eos_ops.localkafka import LocalBroker

    return LocalBroker(port=args.port, data_dir=args.data_dir, heap=getattr(args, "heap", "512m"))


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from eos_ops.localkafka import fetch_jars

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


def register(sub: argparse._SubParsersAction) -> None:
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

"""`eos demo`: the README's run command."""

from __future__ import annotations

import argparse
import sys


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from eos_ops.demo import run_demo

    return run_demo(
        port=args.port,
        external_kafka=args.external_kafka,
        master=args.master,
        events=args.events,
        seed=args.seed,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        keep_running=args.keep_running,
        pg_port=args.pg_port,
        external_postgres=args.external_postgres,
    )


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the ad-attribution demo end to end and check its output",
        description="Start the local broker and PostgreSQL server, write ad impressions and clicks (with "
        "duplicates and late events), run examples/ad_attribution.yaml, and check the per-campaign, per-minute "
        "counts it committed to a topic and to a table against the generator's ground truth. Exit 1 on any "
        "mismatch.",
    )
    demo.add_argument("--port", type=int, default=9092, help="local broker port (9092)")
    demo.add_argument("--external-kafka", action="store_true", help="use $EOS_BOOTSTRAP instead of the local broker")
    demo.add_argument("--pg-port", type=int, default=5432, help="local PostgreSQL port (5432)")
    demo.add_argument(
        "--external-postgres", action="store_true", help="use $EOS_PG_DSN instead of the local PostgreSQL server"
    )
    demo.add_argument("--master", help="Spark master (default local[*])")
    demo.add_argument("--events", type=int, default=40_000, help="distinct ad events to generate (40000)")
    demo.add_argument("--seed", type=int, default=7, help="generator seed (7)")
    demo.add_argument("--metrics-port", type=int, help="serve Prometheus metrics from the driver on this port")
    demo.add_argument(
        "--metrics-host", help="the address the metrics listen on (127.0.0.1; 0.0.0.0 for another container)"
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="after the check, keep generating events and running the pipeline until SIGTERM (for dashboards)",
    )
    demo.set_defaults(func=cmd_demo)

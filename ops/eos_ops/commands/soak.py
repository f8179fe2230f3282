"""`eos soak`: a long randomized fault schedule over a real pipeline, then a verification table."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_soak(args: argparse.Namespace) -> int:
    from eos_ops.soak import run_soak

    return run_soak(args.records, args.chunk, args.seed, args.keep, args.output)


def register(sub: argparse._SubParsersAction) -> None:
    soak = sub.add_parser(
        "soak",
        help="run a long randomized fault schedule (kills, stalls, broker restarts) and verify exactly-once",
        description="Start a private local broker, feed a two-sink pipeline (a keyed copy and a windowed "
        "aggregate) in chunks, and run each chunk under a random fault: kill -9 or a failure at a random "
        "protocol point and epoch, a stalled slot, a failed read task, a broker kill or restart, an outage "
        "past transaction.timeout.ms. Then verify both sinks and print a table. Takes tens of minutes.",
    )
    soak.add_argument("--records", type=int, default=1_000_000, help="input records in all (1000000)")
    soak.add_argument("--chunk", type=int, default=50_000, help="records added before each run (50000)")
    soak.add_argument("--seed", type=int, default=1, help="random seed of the fault schedule (1)")
    soak.add_argument("--output", type=Path, help="also write the table as markdown to this file")
    soak.add_argument("--keep", action="store_true", help="keep the work folder (broker data, checkpoint)")
    soak.set_defaults(func=cmd_soak)

"""`eos delta cleanup PIPELINE.yaml`: a stopped pipeline's staged Delta files."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_delta_cleanup(args: argparse.Namespace) -> int:
    from eos_ops.delta import cleanup

    return cleanup(args.pipeline, take_over=args.take_over)


def register(sub: argparse._SubParsersAction) -> None:
    delta = sub.add_parser(
        "delta",
        help="resolve the files a stopped pipeline left staged in its Delta tables",
        description="Delta sinks stage each epoch's files in the table's folder before the decision; the log never "
        "names the files of an attempt that was not decided, so no reader sees them, but they take space.",
    )
    dsub = delta.add_subparsers(dest="delta_command", required=True, metavar="{cleanup}")
    cleanup = dsub.add_parser(
        "cleanup",
        help="resolve a stopped pipeline's staged Delta files by its recorded decision",
        description="A pipeline resolves its staged files at every start; this does it while it is stopped: the "
        "attempts its last recorded decision commits are committed (unless the table's log shows them committed), "
        "every other staged file of the pipeline is removed (exactly what recovery would do). Refused while the "
        "pipeline's driver still answers.",
    )
    cleanup.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    cleanup.add_argument(
        "--take-over", action="store_true",
        help="fence a driver that still answers (a stale process you cannot stop) instead of refusing",
    )  # fmt: skip
    cleanup.set_defaults(func=cmd_delta_cleanup)

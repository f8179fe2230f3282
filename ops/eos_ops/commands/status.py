"""`eos status PIPELINE.yaml`: checkpoint, control log, ledger, lingering transactions, source lag."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cmd_status(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos_ops.status import gather, render, say

    config = load_pipeline(args.pipeline)
    if args.fence:
        say(
            f"eos status --fence: FENCING every transactional id of pipeline {config.name} and resolving its "
            "prepared transactions, as recovery does: whatever it left open is aborted"
            + (
                " (--force: even while its driver runs; its epoch in flight is aborted and retried)"
                if args.force
                else ""
            )
        )
    report = gather(
        config, args.pipeline.resolve().parent, fence_first=args.fence, transactions=not args.no_txns, force=args.force
    )
    if args.fence and report.get("fence"):
        fenced = report["fence"]
        say(f"eos status --fence: fenced {fenced['fenced_ids']} transactional ids in {fenced['seconds']:.1f} s")
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(render(report)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser(
        "status",
        help="show a pipeline's checkpoint, control log, ledger, lingering transactions and source lag (works "
        "while it is stopped, read-only while it runs)",
        description="Read the checkpoint (last logged and committed epoch, pending replay), the control log (the "
        "driver that took over and whether it answers, the last decision, the pools of transactional ids) and the "
        "ledgers (last committed epoch per sink and slot) without fencing; list lingering transactions of every sink "
        "(and, for Kafka, the pool ids' transactions through Kafka's TransactionsCommand); show the source lag per "
        "partition. Read-only unless --fence.",
    )
    status.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument(
        "--no-txns",
        action="store_true",
        help="skip listing the pool ids' transactions (that starts a JVM with Kafka's TransactionsCommand, ~1-2 s)",
    )
    status.add_argument(
        "--fence",
        action="store_true",
        help="fence every transactional id of every recorded pool and resolve prepared transactions first, as "
        "recovery does (lingering transactions are aborted), then read the whole ledger. Refused while the "
        "pipeline's driver answers, unless --force",
    )
    status.add_argument(
        "--force",
        action="store_true",
        help="with --fence: fence even while the driver answers (ABORTS its epoch in flight; it is retried)",
    )
    status.set_defaults(func=cmd_status)

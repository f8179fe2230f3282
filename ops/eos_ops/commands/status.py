"""`eos status PIPELINE.yaml`: checkpoint, ledger, open transactions and source lag."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_status(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos_ops.status import gather, render

    config = load_pipeline(args.pipeline)
    if args.fence:
        print(
            "eos status --fence: fencing every transactional id of the pipeline (a running pipeline's open epoch "
            "is aborted and retried)",
            file=sys.stderr,
            flush=True,
        )
    report = gather(config, args.pipeline.resolve().parent, fence_first=args.fence, transactions=not args.no_txns)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print("\n".join(render(report)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser(
        "status",
        help="show a pipeline's checkpoint, ledger, open transactions and source lag (works while it is stopped)",
        description="Read the checkpoint (last logged and committed epoch, pending replay) and the ledger (last "
        "committed epoch per sink and slot) without fencing, list open or lingering transactions of the "
        "pipeline's transactional ids, and show the source lag per partition. Read-only unless --fence.",
    )
    status.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument(
        "--no-txns",
        action="store_true",
        help="skip listing transactions (that starts a JVM with Kafka's TransactionsCommand, ~1-2 s)",
    )
    status.add_argument(
        "--fence",
        action="store_true",
        help="fence every transactional id first, aborting lingering transactions, then read the whole ledger. "
        "WARNING: aborts the open epoch of a RUNNING pipeline (it retries); meant for a stopped one",
    )
    status.set_defaults(func=cmd_status)

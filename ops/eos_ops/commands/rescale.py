"""`eos rescale`: change a checkpoint's number of sink slots, the one safe way.

Slot routing must be stable while an epoch can still be replayed: a replay must send every
record to the slot it went to before, or a record could be written by a slot that had not
committed it and also by one that had. So the slot count may change only when nothing is
pending: every epoch Spark logged is marked committed. Then the old transactional ids are
fenced (nothing can linger or commit late) and the new count is recorded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_rescale(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.errors import CheckpointError
    from eos.pipeline import sink_targets
    from eos.protocol.checkpoint import Checkpoint
    from eos.protocol.committer import fence_targets

    config = load_pipeline(args.pipeline)
    checkpoint = Checkpoint(config.checkpoint_path(Path(args.pipeline).resolve().parent))
    checkpoint.lock()  # refuses while the pipeline runs
    try:
        meta = checkpoint.read_meta()
        if meta is None:
            raise CheckpointError(f"{checkpoint.root} has no eos checkpoint yet: just set epochs.slots")
        checkpoint.check_owner(meta, config.name)
        pending = checkpoint.pending_replay()
        if pending is not None:
            raise CheckpointError(
                f"epoch {pending} is logged but not committed, so it will be replayed with the current routing; "
                f"rescaling now could duplicate or lose its output. Run the pipeline once more (for example "
                f"`eos run {args.pipeline} --trigger available-now`), then rescale."
            )
        if meta.slots == args.slots:
            print(f"{config.name}: already {meta.slots} slots; nothing to do")
            return 0
        targets = sink_targets(config).values()
        fenced = fence_targets(targets, max(meta.slots, args.slots))
        print(f"fenced {fenced} transactional ids of {config.name}", file=sys.stderr)
        old, meta.slots = meta.slots, args.slots
        checkpoint.write_meta(meta)
        print(
            f"{config.name}: {old} -> {args.slots} sink slots (from the next epoch on); set epochs.slots: "
            f"{args.slots} in {args.pipeline} to match"
        )
        return 0
    finally:
        checkpoint.unlock()


def register(sub: argparse._SubParsersAction) -> None:
    rescale = sub.add_parser(
        "rescale",
        help="change the number of sink slots of a stopped pipeline's checkpoint, safely",
        description="Change the sink slot count of a pipeline's checkpoint. Allowed only while the pipeline is "
        "stopped and every logged epoch is committed (nothing can be replayed with the old routing); fences "
        "every old transactional id first.",
    )
    rescale.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    rescale.add_argument("--slots", type=int, required=True, help="the new number of sink slots")
    rescale.set_defaults(func=cmd_rescale)

"""`eos reset`: forget a pipeline's progress so it starts over (destructive, explicit).

In this order: refuse while the pipeline's driver answers; take the pipeline over in its control
log (fencing any driver still writing); run recovery as a restart would (fence every
transactional id, resolve prepared transactions by the recorded decision), so nothing of the old
run can linger or commit late; then delete every sink's ledger, the control log, and the
checkpoint. The next run starts from the configured starting offsets.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from pathlib import Path


def cmd_reset(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.errors import ConfigError
    from eos.pipeline import connectors, pipeline_info
    from eos.protocol import recovery
    from eos.protocol.checkpoint import Checkpoint
    from eos.protocol.decision import DriverInfo
    from eos.runner import take_over
    from eos.sparksession import build_spark

    config = load_pipeline(args.pipeline)
    base_dir = Path(args.pipeline).resolve().parent
    location = config.checkpoint_path(base_dir)
    if not args.yes:
        raise ConfigError(
            f"this deletes {location}, the ledger {config.ledger_topic} and the pipeline's control log: the pipeline "
            "will start over from its starting offsets and write its output again. Add --yes to do it."
        )
    spark = None if "://" not in location or location.startswith("file:") else build_spark("eos-reset", "local[1]")
    checkpoint = Checkpoint(location, spark)
    meta = checkpoint.read_meta() if checkpoint.files.exists("_eos/pipeline.json") else None
    if meta is not None:
        checkpoint.check_owner(meta, config.name)
    found = connectors(config, pipeline_info(config, meta.checkpoint_id if meta else "(none)", base_dir))
    control = found.sources[0].control_log()
    try:
        me = DriverInfo(f"reset-{uuid.uuid4().hex[:8]}", socket.gethostname(), os.getpid(), "127.0.0.1:0")
        state = take_over(control, me, allow=False)  # refuses while the pipeline runs
        # Always: the control log (in Kafka) knows the pools even when the checkpoint is gone, and
        # the ledgers are not checked: whatever checkpoint wrote them, they are about to be forgotten.
        report = recovery.recover(
            found.sinks, state.pools, state.decision, checkpoint, meta.checkpoint_id if meta else "(none)", 60,
            "reset", read_ledgers=False,
        )  # fmt: skip
        print(f"fenced {report.fenced_ids} transactional ids; resolved {report.resolved or 'nothing'}")
        for sink in found.sinks:
            sink.forget()
            print(f"forgot sink {sink.name}'s ledger entries")
        control.reset()
        print(f"deleted the control log of {config.name}")
    finally:
        control.close()
    checkpoint.delete()
    print(f"deleted checkpoint {checkpoint.uri}; {config.name} will start over")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    reset = sub.add_parser(
        "reset",
        help="delete a stopped pipeline's checkpoint, ledger and control log so it starts over (needs --yes)",
        description="Forget a pipeline's progress: fence its transactional ids, resolve its prepared transactions, "
        "delete its ledger entries, control log and checkpoint. The next run starts from the configured starting "
        "offsets and writes its output again (downstream readers will see it twice). Refused while the pipeline "
        "runs.",
    )
    reset.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    reset.add_argument("--yes", action="store_true", help="really do it")
    reset.set_defaults(func=cmd_reset)

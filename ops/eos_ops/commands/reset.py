"""`eos reset`: forget a pipeline's progress so it starts over (destructive, explicit).

First, before anything is fenced or deleted, the checkpoint's location is checked: eos deletes
only what Spark and eos wrote there, so a location that could hold anything else (the filesystem's
root, the home folder, the current folder, the pipeline file's folder or one above them) is
refused, and so is a folder that holds anything else (eos.protocol.checkpoint). Then, in this
order: refuse while the pipeline's driver answers; take the pipeline over in its control log
(fencing any driver still writing); run recovery as a restart would (fence every transactional
id, resolve prepared transactions by the recorded decision), so nothing of the old run can linger
or commit late; then forget this pipeline's entries in every sink's ledger and in the control log
(the topics stay: other pipelines may share them), and delete the checkpoint. The next run starts
from the configured starting offsets.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from pathlib import Path


def cmd_reset(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.declared import connectors, pipeline_info
    from eos.driver import take_over
    from eos.errors import ConfigError
    from eos.protocol import recovery
    from eos.protocol.checkpoint import DELETABLE, Checkpoint, is_local, unsafe_location
    from eos.protocol.decision import DriverInfo
    from eos.sparksession import build_spark

    config = load_pipeline(args.pipeline)
    base_dir = Path(args.pipeline).resolve().parent
    location = config.checkpoint_path(base_dir)
    # A pipeline file does not expand `~` (`checkpoint: ~` is a folder named `~` beside it), but
    # whoever wrote it meant their home folder: that reading is refused too.
    for reading in [location] + ([config.checkpoint] if config.checkpoint.startswith("~") else []):
        if problem := unsafe_location(reading, args.pipeline):
            raise ConfigError(f"refusing to reset {config.name}: {problem}", hint=DELETABLE)
    if not args.yes:
        raise ConfigError(
            f"this deletes the checkpoint {location} (what Spark and eos wrote there), {config.name}'s entries in "
            f"the ledger topic {config.ledger_topic} and its control log: the pipeline will start over from its "
            "starting offsets and write its output again. Add --yes to do it."
        )
    # A remote checkpoint is read through Spark's JVM, with the pipeline's settings for its
    # filesystem (spark.hadoop.*: an s3a:// endpoint and credentials) and its connector.
    conf = {key: str(value) for key, value in config.spark.conf.items()}
    spark = None if is_local(location) else build_spark("eos-reset", "local[1]", conf=conf, checkpoint=location)
    checkpoint = Checkpoint(location, spark)
    checkpoint.check_deletable(args.pipeline)  # before anything is fenced or deleted
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
        print(f"forgot {config.name}'s records in its control log")
    finally:
        control.close()
    if checkpoint.delete():
        print(f"deleted checkpoint {checkpoint.uri}; {config.name} will start over")
    else:
        print(
            f"deleted Spark's and eos's files in {checkpoint.uri} and kept the folder (something else appeared "
            f"there meanwhile); {config.name} will start over"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    reset = sub.add_parser(
        "reset",
        help="forget a stopped pipeline's progress (checkpoint, ledger entries, control records) so it starts over "
        "(needs --yes)",
        description="Forget a pipeline's progress: fence its transactional ids, resolve its prepared transactions, "
        "forget its ledger entries and control records, and delete its checkpoint (only what Spark and eos wrote "
        "there). The next run starts from the configured starting offsets and writes its output again (downstream "
        "readers will see it twice). Refused while the pipeline runs, and for a checkpoint location that holds "
        "anything else.",
    )
    reset.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    reset.add_argument("--yes", action="store_true", help="really do it")
    reset.set_defaults(func=cmd_reset)

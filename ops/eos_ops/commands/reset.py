"""`eos reset`: forget a pipeline's progress so it starts over (destructive, explicit)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def cmd_reset(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.errors import ConfigError
    from eos.pipeline import client_config, sink_targets
    from eos.protocol.checkpoint import Checkpoint
    from eos.protocol.committer import fence_targets
    from eos_connectors.kafka.clients import admin_client

    config = load_pipeline(args.pipeline)
    checkpoint = Checkpoint(config.checkpoint_path(Path(args.pipeline).resolve().parent))
    if not args.yes:
        raise ConfigError(
            f"this deletes {checkpoint.root} and the ledger topic {config.ledger_topic}: the pipeline will start "
            "over from its starting offsets and write its output again. Add --yes to do it."
        )
    checkpoint.lock()  # refuses while the pipeline runs
    try:
        meta = checkpoint.read_meta() if checkpoint.meta_file.exists() else None
        if meta is not None:
            checkpoint.check_owner(meta, config.name)
            fence_targets(sink_targets(config).values(), meta.slots)  # nothing may linger or commit late
        clusters = {client_config(s.kafka)["bootstrap.servers"]: client_config(s.kafka) for s in config.sinks}
        for client in clusters.values():
            admin = admin_client(client)
            if config.ledger_topic in admin.list_topics(timeout=10).topics:
                for future in admin.delete_topics([config.ledger_topic], operation_timeout=30).values():
                    future.result()
                print(f"deleted ledger topic {config.ledger_topic} on {client['bootstrap.servers']}")
    finally:
        checkpoint.unlock()
    shutil.rmtree(checkpoint.root, ignore_errors=True)
    print(f"deleted checkpoint {checkpoint.root}; {config.name} will start over")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    reset = sub.add_parser(
        "reset",
        help="delete a stopped pipeline's checkpoint and ledger so it starts over (needs --yes)",
        description="Forget a pipeline's progress: fence its transactional ids, delete its ledger topic and its "
        "checkpoint. The next run starts from the configured starting offsets and writes its output again "
        "(downstream readers will see it twice). Refused while the pipeline runs.",
    )
    reset.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    reset.add_argument("--yes", action="store_true", help="really do it")
    reset.set_defaults(func=cmd_reset)

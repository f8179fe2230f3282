"""`eos run` and `eos validate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from eos.observe.progress import RunRate, outputs
    from eos.runner import RunOptions, run

    rate = RunRate()
    options = RunOptions(
        master=args.master,
        trigger=args.trigger,
        failpoints=args.failpoint or [],
        progress=not args.quiet,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        take_over=args.take_over,
        finish_pending=args.finish_pending,
        listeners=[rate],
        standby=args.standby,
    )
    result = run(args.pipeline, options)
    after_start_up = rate.describe()
    _say(
        f"eos: {result.pipeline} stopped ({result.stopped_by}): {result.epochs_committed} epochs committed, "
        f"records out: {outputs(result.records_out)}" + (f"; {after_start_up}" if after_start_up else "")
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from eos.config import load_pipeline
    from eos.declared import connectors, pipeline_info
    from eos.model import redacted
    from eos.runner import describe_plan

    config = load_pipeline(args.pipeline)
    base_dir = Path(args.pipeline).resolve().parent
    found = connectors(config, pipeline_info(config, "(not created yet)", base_dir))
    for connector in [*found.sources, *found.sinks]:
        connector.validate()  # schema files exist and parse
    if args.json:
        print(json.dumps(redacted(config), indent=2, sort_keys=True))
    else:
        for line in describe_plan(config, base_dir):
            print(line)
        print(f"{args.pipeline}: valid")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run a pipeline (Spark local[*] unless --master or spark-submit says otherwise)",
        description="Run a pipeline exactly once. Stops at the end of the input with --trigger available-now, "
        "else on SIGTERM/SIGINT (finishing the current epoch; a second signal aborts it).",
    )
    run.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    run.add_argument("--master", help="Spark master, e.g. local[4] or spark://host:7077")
    run.add_argument("--trigger", help="override epochs.trigger: an interval like 2s, or available-now")
    run.add_argument(
        "--failpoint",
        action="append",
        metavar="SPEC",
        help="arm a failpoint, e.g. sink.after_precommit=kill@epoch=2 (repeatable; see docs)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no per-epoch progress lines")
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port; default: metrics.port "
        "of the pipeline file, else off)",
    )
    run.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="the address the metrics listen on (default: metrics.host of the pipeline file, else 127.0.0.1; "
        "0.0.0.0 for a Prometheus on another machine or container: the page answers anyone who reaches it)",
    )
    run.add_argument(
        "--take-over",
        action="store_true",
        help="start even if the pipeline's previous driver still answers: it is fenced (it can no longer commit "
        "and stops at its next epoch). Without it, eos refuses to start a second driver.",
    )
    run.add_argument(
        "--finish-pending",
        action="store_true",
        help="replay the pending epoch (logged but not committed) with this pipeline file, then stop: the way to "
        "finish an epoch under its old config before changing the file",
    )
    run.add_argument(
        "--standby",
        action="store_true",
        help="a hot standby: start Spark and build the pipeline, then watch the pipeline's running driver and take "
        "the pipeline over when it is gone (killed, stopped, or silent for ~3 s); writes nothing while it waits",
    )
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a pipeline file without running it")
    validate.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    validate.add_argument("--json", action="store_true", help="print the validated config (secrets masked)")
    validate.set_defaults(func=cmd_validate)

"""`eos check`: the pre-flight of `eos run`, every check, each outcome printed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def cmd_check(args: argparse.Namespace) -> int:
    from eos.config import load_pipeline
    from eos.preflight import Finding, analyse, run_checks

    config = load_pipeline(args.pipeline)
    base_dir = Path(args.pipeline).resolve().parent
    findings = run_checks(config, base_dir, stop_at_first=False)
    for finding in findings:
        _show(finding)
    if not args.no_spark and all(f.ok for f in findings):
        from eos.sparksession import build_spark

        started = time.monotonic()
        print("starting a local Spark to analyse the query's plan...", file=sys.stderr, flush=True)
        # The pipeline's own settings (a connector for its checkpoint's filesystem, say), on one core.
        conf = {k: str(v) for k, v in config.spark.conf.items()}
        spark = build_spark("eos-check", master="local[1]", conf=conf, checkpoint=config.checkpoint_path(base_dir))
        print(f"  (Spark started in {time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
        try:
            finding = analyse(config, base_dir, spark)
        finally:
            spark.stop()
        findings.append(finding)
        _show(finding)
    problems: list[Finding] = [f for f in findings if not f.ok]
    if not problems:
        print(f"{args.pipeline}: ready to run")
        return 0
    print(f"{args.pipeline}: {len(problems)} problem{'s' if len(problems) > 1 else ''}")
    return max(p.error.exit_code for p in problems if p.error is not None)


def _show(finding) -> None:
    if finding.ok:
        print(f"  ok    {finding.what}: {finding.detail}")
        return
    message = str(finding.error).replace("\n", "\n        ")
    print(f"  FAIL  {finding.what}\n        {message}")


def register(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check",
        help="pre-flight a pipeline file: brokers, topics, database, checkpoint, imports, SQL, output mode",
        description="Check a pipeline file against the systems it names and against Spark's analysis, without "
        "running it: the Python transforms import, the checkpoint can be written, every source and sink reaches its "
        "system (topics exist, the database connects and allows prepared transactions), and, on a small local "
        "Spark, the SQL resolves against the sources' schemas, the sinks' columns and keys exist and the output mode "
        "fits the plan. `eos run` runs the same checks first. Exit 0 when ready, else the exit code of the worst "
        "problem (2: the file, 1: the environment).",
    )
    check.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    check.add_argument("--no-spark", action="store_true", help="skip the checks that need Spark (the plan's)")
    check.set_defaults(func=cmd_check)

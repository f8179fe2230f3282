"""`python -m bench`: run the benchmark and write docs/BENCHMARKS.md and bench/results/latest.json.

python -m bench                 everything (~90 min on a quiet machine); waits for one first
python -m bench --quick         every section, small sizes, one run each (~10 min on a quiet machine); writes
                                bench/results/quick.{json,md}, never the docs
python -m bench --sections failpoints,recovery --merge
                                re-run some sections into the existing results
python -m bench --render bench/results/latest.json
                                re-render the markdown from saved results (no runs)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.env import REPO, Progress, host_check_ms, machine, preflight, wait_for_quiet
from bench.sections import SECTIONS

RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "BENCHMARKS.md"
DOC_JSON = REPO / "docs" / "benchmarks.json"


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one run each: a smoke test")
    parser.add_argument("--sections", help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    parser.add_argument("--merge", action="store_true", help="merge into the existing results file")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (checkpoints, logs, profiles)")
    parser.add_argument("--render", type=Path, metavar="JSON", help="only render the markdown from saved results")
    parser.add_argument("--out", type=Path, help="markdown output (default: docs/BENCHMARKS.md, quick: bench/results)")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the benchmark's session, over eos's defaults (every Spark configuration "
        "gets it; repeatable), e.g. to compare state stores",
    )
    return parser.parse_args(argv)


def _say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from bench.report import render
    from bench.report.peers import readme_peers
    from eos.errors import EosError

    argv = sys.argv[1:] if argv is None else argv
    args = _args(argv)
    spark_conf(args.spark_conf)  # a malformed pair stops here, before any server starts
    args.command = " ".join(["python -m bench", *(shlex.quote(a) for a in argv)])
    if args.render:
        results = json.loads(args.render.read_text())
        out = args.out or (RESULTS / "QUICK.md" if results["meta"]["quick"] else DOC)
        out.write_text(render(results))
        _say(f"wrote {out}")
        return 0
    sections = tuple(s.strip() for s in args.sections.split(",")) if args.sections else SECTIONS
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        _say(f"unknown sections: {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
        return 2
    json_path = RESULTS / ("quick.json" if args.quick else "latest.json")
    try:
        results = run(args, sections, json_path)
    except EosError as exc:
        _say(f"error: {exc}")
        return 2
    out = args.out or (RESULTS / "QUICK.md" if args.quick else DOC)
    out.write_text(render(results))
    peers_md = readme_peers(results) if not args.quick else ""  # smoke-test sizes are not README figures
    if peers_md:
        (RESULTS / "README_PEERS.md").write_text(peers_md)
        _say(f"the README's peer table (for its author): {RESULTS / 'README_PEERS.md'}")
    if not args.quick and out == DOC:
        DOC_JSON.write_text(json.dumps(results, indent=1, default=str))
    _say(f"wrote {out} and {json_path}")
    failed = [s for s, r in results.items() if isinstance(r, dict) and "error" in r]
    return 1 if failed else 0


def merge_source(json_path: Path, quick: bool) -> Path | None:
    """The results a `--merge` run keeps its other sections from: this checkout's last run, else
    (a fresh clone: bench/results is gitignored) the tracked copy behind docs/BENCHMARKS.md.
    Without either, a merge would rewrite the docs with only the sections it ran."""
    if json_path.exists():
        return json_path
    return None if quick or not DOC_JSON.exists() else DOC_JSON


def run(args: argparse.Namespace, sections: tuple[str, ...], json_path: Path) -> dict[str, Any]:
    from bench.connector import connector_jars
    from bench.context import FULL, QUICK, Bench, remove, work_dir
    from eos.sparksession import build_spark
    from eos_ops.localkafka import LocalBroker, fetch_jars, free_port

    plan = QUICK if args.quick else FULL
    estimates = {k: v for k, v in plan.estimates().items() if k == "setup" or k in sections}
    progress = Progress(estimates)
    progress.begin("setup")
    tools = preflight()
    fetch_jars(progress.say)
    jars = connector_jars(progress.say)
    if not jars.matches_pyspark:
        progress.say(f"note: Spark's Kafka connector {jars.version} (Maven Central has none for PySpark {jars.wanted})")
    quiet = {"skipped": True, "load_at_start": round(os.getloadavg()[0], 2)}
    if not args.quick and not args.no_wait:
        quiet = wait_for_quiet(1.5, 20 * 60, progress.say)
        progress.exclude(float(quiet["waited_s"]))
    results: dict[str, Any] = {}
    earlier = None
    merge_from = merge_source(json_path, plan.quick) if args.merge else None
    if merge_from is not None:
        progress.say(f"merging into the results of {merge_from}")
        results = json.loads(merge_from.read_text())
        earlier = results.get("meta")  # the run the other sections come from: the report names both
    started_at = datetime.now(timezone.utc)
    results["meta"] = {
        "date": started_at.isoformat(timespec="seconds"),
        "command": args.command,
        "quick": plan.quick,
        "plan": plan.__dict__,
        "machine": machine(),
        "java": tools["java_version"],
        "load": quiet,
        "spark_kafka": {
            "version": jars.version,
            "token_provider": jars.token_version,
            "pyspark": jars.wanted,
            "jars": [Path(j).name for j in jars.jars],
        },
        "sections_run": list(sections),
    }
    if earlier is not None:
        results["meta"]["merged_into"] = earlier
    work = work_dir()
    broker = LocalBroker(port=free_port(), data_dir=work / "broker", heap="1g")
    spark = None
    try:
        broker.start(progress=progress.say)
        spark = build_spark(
            "eos-bench",
            master="local[2]",
            conf={
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.jars": ",".join(jars.jars),
                **spark_conf(args.spark_conf),
            },
        )
        bench = Bench(plan, broker.bootstrap, broker.pid(), spark, work, RESULTS, progress, jars)
        progress.end()
        for section in sections:
            progress.begin(section)
            before = os.getloadavg()[0]
            host_before = host_check_ms()
            t0 = time.monotonic()
            try:
                outcome = _section(section).run(results) if section == "protocol" else _section(section).run(bench)
            except Exception as exc:
                progress.say(f"{section} FAILED: {type(exc).__name__}: {exc}")
                outcome = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
            outcome["_meta"] = {
                "duration_s": round(time.monotonic() - t0, 1),
                "load_before": round(before, 2),
                "load_after": round(os.getloadavg()[0], 2),
                "host_before_ms": host_before,
                "host_after_ms": host_check_ms(),
            }
            results[section] = outcome
            progress.end()
            RESULTS.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(results, indent=1, default=str))
        results["meta"]["duration_s"] = round(time.monotonic() - progress.started, 1)
        results["meta"]["load_at_end"] = round(os.getloadavg()[0], 2)
        json_path.write_text(json.dumps(results, indent=1, default=str))
        return results
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        if args.keep:
            _say(f"kept the work folder {work}")
        else:
            remove(work)


def spark_conf(pairs: list[str]) -> dict[str, str]:
    """--spark-conf KEY=VALUE pairs. They go into the SparkContext's conf: every pipeline runs on a
    new session of it (eos.runner), which starts from that conf, not from settings made on the
    benchmark's session while it runs."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"python -m bench: --spark-conf {pair!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


def _section(name: str):
    import importlib

    return importlib.import_module(f"bench.sections.{name}")

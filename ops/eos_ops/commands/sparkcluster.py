"""`eos spark-cluster start|stop|status`: a local Spark standalone cluster (master + workers)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cluster(args: argparse.Namespace):
    from eos_ops.sparkcluster import LocalSparkCluster

    return LocalSparkCluster(
        args.dir,
        workers=getattr(args, "workers", 2),
        cores_per_worker=getattr(args, "cores", 1),
        memory_per_worker=getattr(args, "memory", "1g"),
    )


def cmd_start(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.start(timeout=args.timeout, progress=_say)
    _say(f"Submit with: {' '.join(cluster.submit_command('APP.py'))}")
    _say(
        f"Applications must authenticate: the secret is in {cluster.submit_properties} (readable by you only). "
        '`eos run --master` takes it as spark.authenticate: "true" and spark.authenticate.secret: '
        '"${VAR}" in the pipeline\'s spark.conf.'
    )
    print(cluster.master_url)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    _cluster(args).stop(progress=_say)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = _cluster(args).status()
    if status.master_pid is None:
        print(f"not running (folder {_cluster(args).workdir})")
        return 3
    print(
        f"master {status.master_url} pid {status.master_pid}, UI {status.webui}"
        + ("" if status.running else ", NOT answering")
    )
    for worker in status.workers:
        executors = f", executors {worker.executors}" if worker.executors else ""
        where = f"pid {worker.pid}, port {worker.port}"
        print(f"worker {worker.index}: {where}, {worker.state}{executors}; log {worker.log_file}")
    for application in status.applications:
        print(f"application {application}")
    expected = len(status.workers)
    return 0 if status.running and status.alive_workers == expected else 1


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser(
        "spark-cluster",
        help="manage a local Spark standalone cluster (master + workers from the PySpark wheel)",
        description="Manage a Spark standalone cluster on loopback: one master and N workers started from the "
        "installed PySpark (its wheel carries Spark), each in its own process group with its own log under "
        "--dir. Ports are free ones chosen at start; `start` prints the master URL. Every process and application "
        "authenticates (spark.authenticate) with a secret made at each start, kept in --dir/conf/submit.properties "
        "(mode 0600): an application without it is refused.",
    )
    csub = cluster.add_subparsers(dest="spark_cluster_command", required=True, metavar="{start,stop,status}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--dir", type=Path, default=None, help="cluster folder (default $EOS_HOME/spark-cluster)")

    start = csub.add_parser("start", help="start master and workers in the background; wait until all are ALIVE")
    common(start)
    start.add_argument("--workers", type=int, default=2, help="number of workers (2)")
    start.add_argument("--cores", type=int, default=1, help="cores per worker (1)")
    start.add_argument("--memory", default="1g", help="memory per worker for its executors, e.g. 1g (1g)")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (120)")
    start.set_defaults(func=cmd_start)

    stop = csub.add_parser("stop", help="stop workers, their executors and the master")
    common(stop)
    stop.set_defaults(func=cmd_stop)

    status = csub.add_parser("status", help="master, workers and running applications (exit 3 if not running)")
    common(status)
    status.set_defaults(func=cmd_status)

"""`eos kafka fetch|start|stop|status`: the embedded local broker, or a local three-node cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eos_ops.localkafka import LocalBroker, LocalCluster

CLUSTER_SIZE = 3


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _broker(args: argparse.Namespace):
    from eos_ops.localkafka import LocalBroker

    heap = getattr(args, "heap", None) or "512m"
    return LocalBroker(port=args.port or 9092, data_dir=args.data_dir, heap=heap, secure=getattr(args, "secure", None))


def _cluster(args: argparse.Namespace):
    from eos_ops.localkafka import LocalCluster

    heap = getattr(args, "heap", None) or "384m"
    return LocalCluster(port=args.port, data_dir=args.data_dir, heap=heap, secure=getattr(args, "secure", None))


def _wants_cluster(args: argparse.Namespace) -> bool:
    """--brokers 3 means the cluster, 1 the single broker. Without it, `start` means the single broker,
    while `stop` and `status` follow what is there: the cluster if its data directory holds one and no
    single broker runs on the port."""
    from eos.errors import ConfigError
    from eos.paths import eos_home

    if args.brokers is not None:
        if args.brokers not in (1, CLUSTER_SIZE):
            raise ConfigError(
                f"--brokers {args.brokers}: the local Kafka is either 1 broker or a {CLUSTER_SIZE}-node cluster.",
                hint=f"use --brokers 1 (the default) or --brokers {CLUSTER_SIZE}",
            )
        return args.brokers == CLUSTER_SIZE
    if args.kafka_command == "start":
        return False
    cluster_dir = Path(args.data_dir) if args.data_dir else eos_home() / f"cluster-{args.port or 9092}"
    return (cluster_dir / "cluster.json").exists() and _broker(args).pid() is None


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from eos_ops.localkafka import fetch_jars

    print(fetch_jars(progress=_say))
    return 0


def cmd_kafka_start(args: argparse.Namespace) -> int:
    cluster = _wants_cluster(args)
    target = _cluster(args) if cluster else _broker(args)
    status = target.start(timeout=args.timeout or (240.0 if cluster else 120.0), progress=_say)
    if status.client_file is not None:
        _say(_secured(status.client_file))
    print(status.bootstrap)
    return 0


def _secured(client_file: Path) -> str:
    return (
        f"Secured: SASL_SSL (SCRAM-SHA-512), ACLs enforced. The super user's client settings: {client_file} "
        f"(private; CA certificate {client_file.parent / 'ca.pem'}). Create a user and ACLs for a pipeline with them."
    )


def cmd_kafka_stop(args: argparse.Namespace) -> int:
    target = _cluster(args) if _wants_cluster(args) else _broker(args)
    target.stop(kill=args.kill, progress=_say)
    return 0


def cmd_kafka_status(args: argparse.Namespace) -> int:
    from eos.paths import eos_home
    from eos_ops.localkafka import LocalBroker, running_here

    if args.port is None and args.data_dir is None and args.brokers is None:
        # Whatever eos started under $EOS_HOME, on any port; each is shown, the worst exit code wins.
        found = running_here()
        if not found:
            print(
                f"not running: no local Kafka broker or cluster of eos runs under {eos_home()} "
                "(one started with --data-dir elsewhere: give it the same --data-dir)"
            )
            return 3
        return max(_broker_status(t) if isinstance(t, LocalBroker) else _cluster_status(t) for t in found)
    return _cluster_status(_cluster(args)) if _wants_cluster(args) else _broker_status(_broker(args))


def _broker_status(broker: LocalBroker) -> int:
    """One line; exit 0 if it answers, 1 if not, 3 if not running."""
    status = broker.status()
    if not status.running:
        print(f"not running (data directory {status.data_dir})")
        return 3
    state = f"answering, {status.topics} topics" if status.answering else "NOT answering"
    print(f"running at {status.bootstrap}, pid {status.pid}, {state}; data {status.data_dir}; log {status.log_file}")
    if status.client_file is not None:
        print(_secured(status.client_file))
    return 0 if status.answering else 1


def _cluster_status(cluster: LocalCluster) -> int:
    """One line for the cluster, one per node; exit 0 if whole, 1 if degraded, 3 if not running."""
    status = cluster.status()
    if not status.running:
        print(f"cluster not running (data directory {status.data_dir})")
        return 3
    controller = status.controller if status.controller is not None else "none (electing, or no quorum)"
    print(
        f"cluster at {status.bootstrap}: brokers {sorted(status.brokers)} of {[n.node_id for n in status.nodes]} "
        f"registered, active controller {controller}; data {status.data_dir}"
    )
    for node in status.nodes:
        pid = f", pid {node.pid}" if node.pid else ""
        print(
            f"  node {node.node_id}: {node.state}{pid}, broker {node.bootstrap}, "
            f"controller {node.controller_endpoint}; log {node.log_file}"
        )
    if status.client_file is not None:
        print(_secured(status.client_file))
    return 0 if status.complete else 1


def register(sub: argparse._SubParsersAction) -> None:
    kafka = sub.add_parser(
        "kafka",
        help="manage the embedded local Kafka broker or 3-node cluster (KRaft, no Docker)",
        description="Manage the embedded local Apache Kafka: a single KRaft node on loopback, or with "
        "--brokers 3 a real three-node KRaft cluster (each node broker and controller, a 3-voter quorum, "
        "replication factor 3, min.insync.replicas 2) for failover tests. The jars are fetched once from "
        "Maven Central with ops/kafka/pom.xml.",
        epilog="examples: `eos kafka start` (one broker on 9092); `eos kafka start --brokers 3` (nodes 1-3 on "
        "9092, 9094, 9096, their controllers on 9093, 9095, 9097; prints the bootstrap list); "
        "`eos kafka stop` finds a running cluster by its data directory; `eos kafka status` without --port or "
        "--data-dir shows every broker and cluster eos runs under $EOS_HOME, on any port.",
    )
    ksub = kafka.add_subparsers(dest="kafka_command", required=True, metavar="{fetch,start,stop,status}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--brokers",
            type=int,
            default=None,
            help=f"1: the single broker (start's default); {CLUSTER_SIZE}: the local cluster. stop and status "
            f"find a cluster by its data directory when this is left out",
        )
        p.add_argument(
            "--port",
            type=int,
            default=None,
            help="client port; the controller uses port+1 (9092). A cluster's node n uses port+2(n-1) and "
            "port+2(n-1)+1; an existing cluster's data directory remembers its port",
        )
        p.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="data directory (default $EOS_HOME/broker-PORT, or $EOS_HOME/cluster-PORT for a cluster)",
        )

    fetch = ksub.add_parser("fetch", help="download the broker jars (done by start if needed)")
    fetch.set_defaults(func=cmd_kafka_fetch)

    start = ksub.add_parser(
        "start",
        help="start the broker (or cluster) in the background and wait until it is ready",
        description="Start in the background and wait until ready (idempotent). A cluster is ready when "
        "all three brokers are registered, a transactional producer can initialise and every partition "
        "is in sync.",
    )
    common(start)
    start.add_argument("--heap", default=None, help="JVM heap, e.g. 512m or 1g (512m; a cluster: 384m per node)")
    start.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for readiness (120; a cluster: 240)"
    )
    start.add_argument(
        "--secure",
        action="store_true",
        default=None,
        help="a new data directory gets SASL_SSL (SCRAM-SHA-512 over TLS, a CA made here) and the "
        "StandardAuthorizer (no ACL, no access); the super user's client settings are written to "
        "DATA_DIR/security/client.properties. An existing data directory keeps the security it was made with",
    )
    start.set_defaults(func=cmd_kafka_start)

    stop = ksub.add_parser("stop", help="shut the broker (or every node of the cluster) down cleanly")
    common(stop)
    stop.add_argument("--kill", action="store_true", help="SIGKILL instead of a clean shutdown")
    stop.set_defaults(func=cmd_kafka_stop)

    status = ksub.add_parser(
        "status",
        help="is it running and answering? (exit 3 if not running; a cluster: 1 if a node is down)",
        description="Without --port, --data-dir or --brokers: every broker and cluster eos started under "
        "$EOS_HOME that runs, on any port (exit 3 if none). For a cluster: each node's state (running, paused, "
        "stopped), the registered brokers and the active controller.",
    )
    common(status)
    status.set_defaults(func=cmd_kafka_status)

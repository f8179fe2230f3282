"""`python -m bench.peers`: run the peer baselines (and, for comparison, the raw confluent-kafka
loops) on one input, outside the full benchmark.

    python -m bench.peers --events 200000 --peers quix,kstreams,raw-txn
    python -m bench.peers --bootstrap 127.0.0.1:9092 --events 50000 --peers quix --quix-processes 2

Without --bootstrap it starts a local broker of its own (a free port, a temporary folder) and stops
it at the end. Each run writes to a fresh output topic, counted with read_committed afterwards and
then dropped. Prints one line per run and, with --json, every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.inputs import count_records, delete_topics, expected_stateless_out, make_input
from bench.peers import run_kstreams, run_quix
from eos_connectors.kafka.clients import admin_client, create_topic

PEERS = ("quix", "kstreams", "raw", "raw-txn")
SEED = 7  # make_input's, so generate_events(events, SEED) gives the input's ground truth


def run_one(spec: str, args: argparse.Namespace, bootstrap: str, broker_pid: int | None, source: Any) -> dict[str, Any]:
    peer, _, width = spec.partition("@")  # quix@2: two processes; kstreams@1: one stream thread
    out_topic = f"peers-{peer}-{args.pipeline}-{time.monotonic_ns()}"
    out_partitions = 4 if args.pipeline == "stateless" else 2
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None)
    if peer == "quix":
        row = run_quix(
            bootstrap, source.topic, out_topic, source.records, source.partitions,
            pipeline=args.pipeline, processes=int(width or args.quix_processes), broker_pid=broker_pid,
            commit_interval=args.quix_commit_interval, progress=say,
            expected_out=source.windows_expected if args.pipeline == "stateful" else None,
        )  # fmt: skip
    elif peer == "kstreams":
        row = run_kstreams(
            bootstrap, source.topic, out_topic, source.records, source.partitions,
            pipeline=args.pipeline, threads=int(width or args.kstreams_threads), broker_pid=broker_pid,
            commit_interval_ms=args.kstreams_commit_interval_ms, progress=say,
        )  # fmt: skip
    else:
        from bench.rawloop import run_loop

        create_topic(admin_client({"bootstrap.servers": bootstrap}), out_topic, out_partitions)
        loop = run_loop(
            bootstrap, source.topic, out_topic, args.pipeline, broker_pid,
            transactional=peer == "raw-txn", batch=args.raw_batch, txn_id=out_topic,
        )  # fmt: skip
        cpu_s = loop.cpu["driver"] + loop.cpu["tools"]
        row = {
            "peer": "raw confluent-kafka loop" + (", transactional" if peer == "raw-txn" else ""),
            "pipeline": args.pipeline,
            "records_in": source.records,
            "records_out": loop.records_out,
            "wall_s": round(loop.wall_s, 3),
            "rps_wall": source.records / loop.wall_s,
            "cpu_s": round(cpu_s, 2),
            "cpu_us_per_record": cpu_s * 1e6 / source.records,
            "broker_cpu_s": loop.cpu["broker"],
            "broker_cpu_us_per_record": loop.cpu["broker"] * 1e6 / source.records,
            "cpu": loop.cpu,
            "transactions": loop.transactions,
        }
    row["records_out_committed"] = count_records(bootstrap, out_topic)
    if args.check:
        row["check"] = check(args, bootstrap, source, out_topic)
    delete_topics(bootstrap, [out_topic])
    return row


def check(args: argparse.Namespace, bootstrap: str, source: Any, out_topic: str) -> str:
    """How the committed output compares with what the pipeline must output: the stateless
    record count (bench.inputs' own filter), or the stateful windows against the generator's truth."""
    if args.pipeline == "stateless":
        expected = expected_stateless_out(bootstrap, source.topic)
        got = count_records(bootstrap, out_topic)
        return "exact count" if got == expected else f"{got:,} records out, {expected:,} expected"
    import io

    import fastavro

    from eos_connectors.kafka.clients import describe_partitions, end_offsets
    from eos_connectors.kafka.range_reader import range_consumer, read_range
    from eos_ops.demo import OUTPUT_SCHEMA, avro_schema, generate_events

    _, truth = generate_events(args.events, SEED)
    expected = truth.expected_counts()
    schema = avro_schema(OUTPUT_SCHEMA)
    got: dict[tuple[str, int], tuple[int, int]] = {}
    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = describe_partitions(admin, [out_topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    reader = range_consumer({"bootstrap.servers": bootstrap})
    try:
        for partition in partitions[out_topic]:
            for batch in read_range(reader, out_topic, partition, 0, ends[(out_topic, partition)]):
                for message in batch:
                    row = fastavro.schemaless_reader(io.BytesIO(message.value()), schema, None)
                    start = int(row["window_start"].timestamp() * 1000)
                    got[(row["campaign_id"], start)] = (row["impressions"], row["clicks"])
    finally:
        reader.close()
    exact = sum(got.get(k) == v for k, v in expected.items())
    short = sum(sum(v) - sum(got.get(k, (0, 0))) for k, v in expected.items())
    return f"{exact}/{len(expected)} windows exact, {short:,} events short of the truth"


def line(row: dict[str, Any]) -> str:
    processing = f", processing {row['rps_processing']:,.0f} rec/s" if row.get("rps_processing") else ""
    return (
        f"{row['peer']} [{row['pipeline']}]: {row['rps_wall']:,.0f} rec/s wall ({row['wall_s']:.1f} s){processing}; "
        f"CPU {row['cpu_us_per_record']:.1f} µs/record (broker {row['broker_cpu_us_per_record']:.1f}); "
        f"{row['records_out_committed']:,} out (committed)" + (f"; {row['check']}" if row.get("check") else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Run the peer baselines (and the raw confluent-kafka loops) on one input, outside the benchmark.",
    )
    parser.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    parser.add_argument("--broker-pid", type=int, help="with --bootstrap: the broker's pid, for its CPU")
    parser.add_argument("--events", type=int, default=200_000, help="distinct events (records are ~8%% more)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--pipeline", choices=("stateless", "stateful"), default="stateless")
    parser.add_argument(
        "--peers",
        default="quix,kstreams,raw-txn",
        help=f"comma-separated, of {', '.join(PEERS)}; quix@N runs N processes, kstreams@N N stream threads",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quix-processes", type=int, default=1)
    parser.add_argument("--quix-commit-interval", type=float, default=5.0)
    parser.add_argument("--kstreams-threads", type=int, default=2)
    parser.add_argument("--kstreams-commit-interval-ms", type=int)
    parser.add_argument("--raw-batch", type=int, default=50_000, help="records per transaction of raw-txn")
    parser.add_argument("--check", action="store_true", help="compare each run's output with the expected output")
    parser.add_argument("--json", action="store_true", help="print every row as JSON too")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = {p.partition("@")[0] for p in peers} - set(PEERS)
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")

    broker = None
    workdir = None
    if args.bootstrap:
        bootstrap, broker_pid = args.bootstrap, args.broker_pid
    else:
        from eos_ops.localkafka import LocalBroker, free_port

        workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
        broker = LocalBroker(port=free_port(), data_dir=workdir / "broker", heap="1g")
        broker.start(progress=lambda m: print(m, file=sys.stderr, flush=True))
        bootstrap, broker_pid = broker.bootstrap, broker.pid()
    try:
        topic = f"peers-input-{args.events}-p{args.partitions}-{os.getpid()}"
        source = make_input(bootstrap, topic, args.partitions, args.events)
        print(f"input: {source.records:,} records over {source.partitions} partitions", file=sys.stderr)
        rows = []
        for round_no in range(args.rounds):
            order = peers[round_no % len(peers) :] + peers[: round_no % len(peers)]
            for peer in order:
                row = run_one(peer, args, bootstrap, broker_pid, source)
                row["round"] = round_no
                rows.append(row)
                print(line(row), flush=True)
                if args.json:
                    print(json.dumps(row), flush=True)
        delete_topics(bootstrap, [topic])
    finally:
        if broker is not None:
            broker.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

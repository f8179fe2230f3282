"""Load generator and latency probe, run as its own process (`python -m bench.probe ...`) so its
Python threads never compete with the pipeline's driver for a GIL.

It writes live ad events at a steady rate (event_time = the moment produce() is called), and,
unless --no-probe, reads the pipeline's output with isolation.level=read_committed and records,
for every event produced after the warm-up, when it became visible there. It stops producing
after warm-up + measure seconds, waits up to --drain seconds for the last records, and writes
its result as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from bench.inputs import encode_event, live_event
from bench.rawloop import VIEW_SCHEMA_FILE, _parse
from bench.stats import percentile

partition_of: dict[str, int] = {}  # event id -> input partition (with --partitions)


def produce(args: argparse.Namespace, expected: dict[str, int], stop: threading.Event, stats: dict[str, Any]) -> None:
    from eos_connectors.kafka.clients import producer
    from eos_ops.demo import EVENT_SCHEMA, avro_schema

    schema = avro_schema(EVENT_SCHEMA)
    out = producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    rng = random.Random(11)
    started = time.monotonic()
    measure_from = started + args.warmup
    measure_to = measure_from + args.measure
    n = 0
    tick = 0.01  # write in 10 ms slices: steady, not bursty
    # --partitions: records go round a cycle of partitions, partition 0 `--hot` times per cycle
    # (one hot partition at `hot` times the rate of each other one); else by key hash.
    cycle = [0] * args.hot + list(range(1, args.partitions)) if args.partitions else None
    while not stop.is_set():
        now = time.monotonic()
        if now >= measure_to:
            break
        due = int((now - started) * args.rate)
        while n < due:
            now_ms = int(time.time() * 1000)
            event = live_event(n, 11, now_ms, rng)
            where = {"partition": cycle[n % len(cycle)]} if cycle else {}
            n += 1
            if now >= measure_from and event["campaign_id"] != "campaign-00":  # the pipeline's filter
                expected[event["event_id"]] = now_ms
                if cycle:
                    partition_of[event["event_id"]] = where["partition"]
            while True:
                try:
                    out.produce(args.input, encode_event(event, schema), event["event_id"].encode(), **where)
                    break
                except BufferError:
                    out.poll(0.01)
        out.poll(0)
        time.sleep(max(0.0, tick - (time.monotonic() - now)))
    out.flush(30)
    stats["produced"] = n
    stats["produce_s"] = time.monotonic() - started


def probe(args: argparse.Namespace, expected: dict[str, int], seen: dict[str, int], stop: threading.Event) -> None:
    from confluent_kafka import TopicPartition
    from fastavro import schemaless_reader

    from eos_connectors.kafka.clients import consumer

    schema = _parse(VIEW_SCHEMA_FILE)
    reader = consumer(
        {"bootstrap.servers": args.bootstrap},
        **{
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
            "group.id": f"bench-probe-{time.monotonic_ns()}",
        },
    )
    reader.assign([TopicPartition(args.output, p, 0) for p in range(args.output_partitions)])
    try:
        while not stop.is_set():
            for message in reader.consume(1000, 0.05):
                if message.error() is not None:
                    continue
                visible_ms = int(time.time() * 1000)
                record = schemaless_reader(io.BytesIO(message.value()), schema, None)
                seen.setdefault(record["event_id"], visible_ms - record["event_time"])
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output")
    parser.add_argument("--output-partitions", type=int, default=4)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--measure", type=float, default=30)
    parser.add_argument("--drain", type=float, default=30)
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--partitions", type=int, default=0, help="place records on the input's partitions")
    parser.add_argument("--hot", type=int, default=1, help="partition 0's rate over each other partition's")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()

    expected: dict[str, int] = {}
    seen: dict[str, int] = {}
    stats: dict[str, Any] = {}
    stop = threading.Event()
    reader = None
    if not args.no_probe:
        reader = threading.Thread(target=probe, args=(args, expected, seen, stop), daemon=True)
        reader.start()
    produce(args, expected, stop, stats)
    if reader is not None:
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline and not all(e in seen for e in list(expected)):
            time.sleep(0.1)
        stop.set()
        reader.join(10)
    latencies = sorted(seen[e] / 1000 for e in expected if e in seen)
    result = {
        **stats,
        "rate": args.rate,
        "expected": len(expected),
        "visible": len(latencies),
        "missing": len(expected) - len(latencies),
        "p50_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "p99_s": percentile(latencies, 99),
        "max_s": latencies[-1] if latencies else None,
        "mean_s": sum(latencies) / len(latencies) if latencies else None,
    }
    if args.partitions:
        for label, chosen in (("hot", lambda p: p == 0), ("cold", lambda p: p != 0)):
            part = sorted(seen[e] / 1000 for e in expected if e in seen and chosen(partition_of[e]))
            result[f"{label}_visible"] = len(part)
            for q in (50, 99):
                result[f"{label}_p{q}_s"] = percentile(part, q)
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

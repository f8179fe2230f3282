"""Raw confluent-kafka consume -> transform -> produce loops in one Python process: the ceiling
for a Python path (no Spark, no shuffle, no JVM-Python transfer).

Written the way a careful Python developer would: fastavro's compiled reader and writer per
record (logical types read as plain longs, as eos's codec does), `produce_batch`, the same
producer batching as eos's sink. The same decisions as the pipelines' SQL are made per record.

- `transactional=False`: at-least-once (idempotent producer); the ceiling.
- `transactional=True`: Kafka's own exactly-once loop (read-process-write with
  send_offsets_to_transaction), one transaction per `batch` input records (= an epoch).

The stateful loop is the demo's aggregation by hand: dedup by event_id while the event is within
the watermark, count clicks and impressions per campaign per event-time minute, emit a window once
the watermark (max event time seen - 1 minute, advanced per consumed batch as Spark advances it
per micro-batch) passes its end, and drop events older than the watermark.
"""

from __future__ import annotations

import heapq
import io
import os
import time
from dataclasses import dataclass, field
from typing import Any

from bench.procs import CpuMeter
from eos.paths import schemas_dir
from eos_connectors.kafka.clients import admin_client, consumer, describe_partitions, end_offsets, producer
from eos_connectors.kafka.range_reader import FETCH_TUNING
from eos_connectors.kafka.sink import PRODUCER_BATCHING, produce_pairs
from eos_ops.demo import EVENT_SCHEMA, OUTPUT_SCHEMA

MINUTE_MS = 60_000
WATERMARK_DELAY_MS = 60_000
VIEW_SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "schemas", "ad_view.avsc")


def _physical(schema: Any) -> Any:
    """The schema with logical types dropped: timestamps stay longs (no datetime per record)."""
    if isinstance(schema, dict):
        return {k: _physical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_physical(s) for s in schema]
    return schema


def _parse(path: str) -> Any:
    import json

    import fastavro

    with open(path) as f:
        return fastavro.parse_schema(_physical(json.load(f)))


@dataclass
class LoopRun:
    wall_s: float
    records_in: int
    records_out: int
    cpu: dict[str, float]
    transactions: int = 0
    profile: dict[str, float] = field(default_factory=dict)


class _Stateless:
    def __init__(self) -> None:
        self.out_schema = _parse(VIEW_SCHEMA_FILE)

    def process(self, records: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
        from fastavro import schemaless_writer

        out = []
        for r in records:
            if r["event_type"] == "heartbeat" or r["campaign_id"] == "campaign-00":
                continue
            buf = io.BytesIO()
            schemaless_writer(
                buf,
                self.out_schema,
                {
                    "event_id": r["event_id"],
                    "campaign_id": r["campaign_id"],
                    "event_type": r["event_type"],
                    "event_time": r["event_time"],
                },
            )
            out.append((r["event_id"].encode(), buf.getvalue()))
        return out

    def finish(self) -> list[tuple[bytes, bytes]]:
        return []


class _Stateful:
    def __init__(self) -> None:
        self.out_schema = _parse(str(schemas_dir() / OUTPUT_SCHEMA))
        self.max_event_time = 0
        self.watermark = 0
        self.seen: dict[str, int] = {}
        self.expiry: list[tuple[int, str]] = []  # (event_time, event_id) heap for dedup state
        self.windows: dict[tuple[str, int], list[int]] = {}

    def process(self, records: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
        watermark = self.watermark  # this batch runs with the watermark of the batches before it
        for r in records:
            t = r["event_time"]
            self.max_event_time = max(self.max_event_time, t)
            if t < watermark or r["event_id"] in self.seen:
                continue
            self.seen[r["event_id"]] = t
            heapq.heappush(self.expiry, (t, r["event_id"]))
            if r["event_type"] not in ("impression", "click"):
                continue
            counts = self.windows.setdefault((r["campaign_id"], t - t % MINUTE_MS), [0, 0])
            counts[0 if r["event_type"] == "impression" else 1] += 1
        self.watermark = max(self.watermark, self.max_event_time - WATERMARK_DELAY_MS)
        return self._emit()

    def _emit(self) -> list[tuple[bytes, bytes]]:
        from fastavro import schemaless_writer

        while self.expiry and self.expiry[0][0] < self.watermark:
            _, event_id = heapq.heappop(self.expiry)
            self.seen.pop(event_id, None)
        out = []
        for (campaign, start), (impressions, clicks) in list(self.windows.items()):
            if start + MINUTE_MS <= self.watermark:
                del self.windows[(campaign, start)]
                buf = io.BytesIO()
                schemaless_writer(
                    buf,
                    self.out_schema,
                    {
                        "campaign_id": campaign,
                        "window_start": start,
                        "window_end": start + MINUTE_MS,
                        "impressions": impressions,
                        "clicks": clicks,
                    },
                )
                minute = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(start / 1000))
                out.append((f"{campaign}|{minute}".encode(), buf.getvalue()))
        return out

    def finish(self) -> list[tuple[bytes, bytes]]:
        return self._emit()


def run_loop(
    bootstrap: str,
    topic: str,
    out_topic: str,
    pipeline: str,
    broker_pid: int | None,
    transactional: bool = False,
    batch: int = 50_000,
    txn_id: str = "bench-raw",
) -> LoopRun:
    from confluent_kafka import TopicPartition
    from fastavro import schemaless_reader

    meter = CpuMeter(os.getpid(), broker_pid)
    meter.start()
    started = time.monotonic()
    client = {"bootstrap.servers": bootstrap}
    admin = admin_client(client)
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    group = f"bench-raw-{os.getpid()}-{time.monotonic_ns()}"
    reader = consumer(
        client,
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            **FETCH_TUNING,
        },
    )
    settings = {**client, **PRODUCER_BATCHING}
    if transactional:
        out = producer({**settings, "transactional.id": txn_id})
        out.init_transactions(60)
    else:
        out = producer({**settings, "enable.idempotence": True})
    reader.assign([TopicPartition(topic, p, 0) for p in partitions[topic]])
    schema = _parse(str(schemas_dir() / EVENT_SCHEMA))
    logic = _Stateless() if pipeline == "stateless" else _Stateful()
    remaining = {(topic, p) for p in partitions[topic] if ends[(topic, p)] > 0}
    records_in = records_out = transactions = in_txn = 0
    if transactional:
        out.begin_transaction()
    try:
        while remaining:
            messages = reader.consume(10_000, 0.5)
            decoded = []
            for m in messages:
                if m.error() is not None:
                    continue
                decoded.append(schemaless_reader(io.BytesIO(m.value()), schema, None))
                if m.offset() + 1 >= ends[(m.topic(), m.partition())]:
                    remaining.discard((m.topic(), m.partition()))
            records_in += len(decoded)
            rows = logic.process(decoded)
            if not remaining:
                rows += logic.finish()
            produce_pairs(out, out_topic, rows)
            records_out += len(rows)
            in_txn += len(decoded)
            if transactional and (in_txn >= batch or not remaining):
                positions = reader.position([TopicPartition(topic, p) for p in partitions[topic]])
                out.send_offsets_to_transaction(positions, reader.consumer_group_metadata(), 60)
                out.commit_transaction(60)
                transactions += 1
                in_txn = 0
                if remaining:
                    out.begin_transaction()
        if not transactional and out.flush(120):
            raise RuntimeError(f"records to {out_topic} still undelivered after 120 s")
    finally:
        reader.close()
    wall = time.monotonic() - started
    return LoopRun(wall, records_in, records_out, meter.stop(), transactions)

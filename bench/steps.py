"""The Python work of eos's data path, step by step, in one process: µs of CPU per record.

Each step is timed alone with `time.process_time` (CPU of this process, all threads: librdkafka's
too), on the same records, by the same functions the pipeline runs:
  consume       read_range over every partition (librdkafka fetch, decompress, Message objects)
  to_arrow      the reader's batch building around the decode (keys, offsets, timestamps, headers
                lists) = to_arrow minus decode_batch
  decode        eos_connectors.formats.avro.decode_batch (fastavro per record, one pa.array)
  transform     the stateless pipeline's filter and projection, in Arrow compute (in the pipeline
                Spark's generated code does it in the JVM; here only for the next step's input)
  encode        encode_batch of the projected rows (struct -> to_pylist -> fastavro per record)
  produce       produce_rows: to_pylist of key and value, produce_batch, poll; then flush
and, for comparison, the raw loop's per-record work: fastavro `schemaless_reader` per message and
its transform + encode (bench.rawloop), produce_pairs. What this leaves out is what only a
pipeline run shows (profile section): Arrow transfers between the JVM and the Python workers,
Spark's task and epoch overhead.
"""

from __future__ import annotations

import io
import time
from typing import Any


def step_costs(bootstrap: str, topic: str, out_topic: str, repeats: int = 3) -> dict[str, Any]:
    """µs of CPU per record of each step: the least over `repeats` passes (CPU time of a step grows
    with the machine's load, through cache and scheduler effects, never shrinks)."""
    passes = [_one_pass(bootstrap, topic, out_topic) for _ in range(repeats)]
    steps = passes[0]["us_per_record"]
    return {
        "records": passes[0]["records"],
        "repeats": repeats,
        "us_per_record": {k: min(p["us_per_record"][k] for p in passes) for k in steps},
        "passes": [p["us_per_record"] for p in passes],
    }


def _one_pass(bootstrap: str, topic: str, out_topic: str) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    from fastavro import schemaless_reader

    from bench.pipelines import OUTPUT_SCHEMA
    from bench.rawloop import _parse, _Stateless
    from eos.paths import schemas_dir
    from eos_connectors.formats.avro import decode_batch, decode_codec, encode_batch, encode_codec
    from eos_connectors.formats.config import FormatConfig
    from eos_connectors.kafka.clients import admin_client, describe_partitions, end_offsets, producer
    from eos_connectors.kafka.range_reader import range_consumer, read_range
    from eos_connectors.kafka.reader import ReaderOptions, to_arrow
    from eos_connectors.kafka.sink import PRODUCER_BATCHING, produce_pairs, produce_rows
    from eos_ops.demo import EVENT_SCHEMA

    pa.array([1])  # pyarrow's first conversion imports pandas (~0.3 s of CPU once per process): not a step
    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = describe_partitions(admin, [topic])[topic]
    ends = end_offsets(admin, {topic: partitions}, read_committed=True)
    value_codec = decode_codec(FormatConfig(type="avro", schema=EVENT_SCHEMA), "value", schemas_dir(), [topic])
    view_codec = encode_codec(FormatConfig(type="avro", schema=OUTPUT_SCHEMA), "value", None, out_topic)
    options = ReaderOptions(
        name="steps", client={"bootstrap.servers": bootstrap}, topics=[topic], starting={}, topic_ids={},
        parallelism=1, on_error="fail", value_codec=value_codec,
    )  # fmt: skip
    # The source's read tasks' consumer (eos_connectors.kafka.reader._cached_consumer).
    settings = {"enable.partition.eof": True, "auto.offset.reset": "error"}
    reader = range_consumer({"bootstrap.servers": bootstrap}, **settings)
    cpu: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        started = time.process_time()
        result = fn()
        cpu[name] = cpu.get(name, 0.0) + time.process_time() - started
        return result

    messages: list[tuple[int, list[Any]]] = []
    for p in partitions:
        batches = timed("consume", lambda p=p: list(read_range(reader, topic, p, 0, ends[(topic, p)])))
        messages += [(p, m) for m in batches]
    reader.close()
    records = sum(len(m) for _, m in messages)
    batches = [timed("to_arrow", lambda p=p, m=m: to_arrow(options, m, topic, p)) for p, m in messages]
    values = [pa.array([x.value() for x in m], pa.binary()) for _, m in messages]
    for v in values:
        timed("decode", lambda v=v: decode_batch(value_codec, v))
    cpu["to_arrow"] -= cpu["decode"]

    def project(batch: Any) -> Any:
        value = batch.column("value")
        keep = pc.and_(
            pc.not_equal(value.field("event_type"), "heartbeat"),
            pc.not_equal(value.field("campaign_id"), "campaign-00"),
        )
        rows = value.filter(keep)
        struct = pa.StructArray.from_arrays(
            [rows.field("event_id"), rows.field("campaign_id"), rows.field("event_type").cast(pa.string()),
             rows.field("event_time")],
            names=["event_id", "campaign_id", "event_type", "event_time"],
        )  # fmt: skip
        return rows.field("event_id").cast(pa.binary()), struct

    projected = [timed("transform", lambda b=b: project(b)) for b in batches]
    encoded = [(k, timed("encode", lambda s=s: encode_batch(view_codec, s))) for k, s in projected]
    out = producer({"bootstrap.servers": bootstrap, **PRODUCER_BATCHING, "enable.idempotence": True})
    for key, value in encoded:
        batch = pa.RecordBatch.from_arrays(
            [
                key,
                value,
                pa.array([[]] * len(key), pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ],
            names=["key", "value", "headers"],
        )
        timed("produce", lambda b=batch: produce_rows(out, out_topic, b))
    timed("produce", lambda: out.flush(60))

    # The raw loop's way, on the same messages.
    schema = _parse(str(schemas_dir() / EVENT_SCHEMA))
    logic = _Stateless()
    decoded = [
        timed("raw: decode", lambda m=m: [schemaless_reader(io.BytesIO(x.value()), schema, None) for x in m])
        for _, m in messages
    ]
    pairs = [timed("raw: transform + encode", lambda d=d: logic.process(d)) for d in decoded]
    for rows in pairs:
        timed("raw: produce", lambda r=rows: produce_pairs(out, out_topic, r))
    timed("raw: produce", lambda: out.flush(60))
    return {"records": records, "us_per_record": {k: round(v * 1e6 / records, 2) for k, v in cpu.items()}}

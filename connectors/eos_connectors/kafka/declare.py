"""The Kafka source and sink of the Python API: `kafka.Source(...)` and `kafka.Sink(...)` build the
same typed entries a pipeline file's `kafka:` sections give (eos_connectors.kafka.config)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from eos.api import ClientValue, WatermarkConfig
from eos_connectors.declare import entry
from eos_connectors.formats.config import FormatConfig
from eos_connectors.kafka.config import KafkaSinkEntry, KafkaSourceEntry

FormatLike = FormatConfig | Mapping[str, Any] | str


def Source(
    name: str,
    *,
    bootstrap: str,
    topics: Sequence[str],
    value_format: FormatLike = "raw",
    key_format: FormatLike = "raw",
    starting_offsets: Literal["earliest", "latest"] | Mapping[str, Mapping[int, int]] = "earliest",
    max_records_per_epoch: int | None = None,
    max_records_per_task: int | None = None,
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed",
    on_out_of_range: Literal["fail", "earliest"] = "fail",
    config: Mapping[str, ClientValue] | None = None,
    watermark: WatermarkConfig | tuple[str, str | float] | None = None,
    on_error: Literal["fail", "skip", "dlq"] = "fail",
    dlq_topic: str | None = None,
) -> KafkaSourceEntry:
    """A Kafka source: `topics` read exactly once (read_committed), decoded by `value_format`
    (and `key_format`): "raw", "string", {"type": "json", "schema": ...}, {"type": "avro", ...}.
    `watermark`: (column, delay) such as ("event_time", "1 minute"). `config`: librdkafka settings
    (security, tuning). `on_error`: what a record that cannot be decoded does: fail the pipeline,
    be skipped (counted), or go to `dlq_topic`."""
    if isinstance(watermark, tuple):
        watermark = WatermarkConfig(column=watermark[0], delay=watermark[1])
    section = {
        "bootstrap": bootstrap,
        "topics": list(topics),
        "starting_offsets": starting_offsets,
        "max_records_per_epoch": max_records_per_epoch,
        "max_records_per_task": max_records_per_task,
        "isolation": isolation,
        "on_out_of_range": on_out_of_range,
        "config": dict(config or {}),
    }
    return entry(
        KafkaSourceEntry,
        f"kafka.Source({name!r})",
        {
            "name": name,
            "kafka": {k: v for k, v in section.items() if v is not None},
            "key_format": key_format,
            "value_format": value_format,
            "watermark": watermark,
            "on_error": on_error,
            "dlq_topic": dlq_topic,
        },
    )


def Sink(
    name: str,
    *,
    bootstrap: str,
    topic: str,
    key: str | None = None,
    value: str | None = None,
    headers: str | None = None,
    value_format: FormatLike = "json",
    key_format: FormatLike = "string",
    create_topic: bool = False,
    partitions: int = 1,
    config: Mapping[str, ClientValue] | None = None,
    transactional_id_prefix: str | None = None,
) -> KafkaSinkEntry:
    """A Kafka sink: each epoch's rows written to `topic` in transactions committed with the
    epoch. `key`, `value`, `headers`: SQL expressions over the rows' columns (the value defaults
    to every column, encoded by `value_format`)."""
    return entry(
        KafkaSinkEntry,
        f"kafka.Sink({name!r})",
        {
            "name": name,
            "kafka": {
                "bootstrap": bootstrap,
                "topic": topic,
                "create_topic": create_topic,
                "partitions": partitions,
                "config": dict(config or {}),
            },
            "key": key,
            "value": value,
            "headers": headers,
            "key_format": key_format,
            "value_format": value_format,
            "transactional_id_prefix": transactional_id_prefix,
        },
    )

"""The Kafka sections of a pipeline file: a source (`kafka:` under sources) and a sink."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from eos.api import NAME, SINK_NAME, VIEW, ClientValue, Model, SinkEntry, SourceEntry
from eos_connectors.formats.config import Format, FormatConfig

StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[int, int]]


class KafkaSourceSection(Model):
    bootstrap: str = Field(min_length=1)
    topics: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1)
    starting_offsets: StartingOffsets = "earliest"
    max_records_per_epoch: int | None = Field(None, gt=0)
    max_records_per_task: int = Field(200_000, gt=0)
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed"
    on_out_of_range: Literal["fail", "earliest"] = "fail"
    config: dict[str, ClientValue] = Field(default_factory=dict)

    @field_validator("topics")
    @classmethod
    def _unique(cls, topics: list[str]) -> list[str]:
        if len(set(topics)) != len(topics):
            raise ValueError("a topic is listed twice")
        return topics

    def client(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.config}


class KafkaSourceEntry(SourceEntry):
    name: str = Field(pattern=VIEW)
    kafka: KafkaSourceSection
    key_format: Format = FormatConfig()
    value_format: Format = FormatConfig()
    dlq_topic: str | None = Field(None, pattern=NAME)

    @model_validator(mode="after")
    def _dlq(self) -> KafkaSourceEntry:
        for which, fmt in (("key_format", self.key_format), ("value_format", self.value_format)):
            if fmt.type in ("json", "csv") and not fmt.has_schema:
                raise ValueError(
                    f"{which}: decoding {fmt.type} needs `schema:`, its fields as Spark DDL "
                    '("id STRING, amount DOUBLE") or an .avsc file'
                )
        if self.on_error == "dlq" and not self.dlq_topic:
            raise ValueError("on_error: dlq needs dlq_topic")
        if self.on_error != "dlq" and self.dlq_topic:
            raise ValueError(f"dlq_topic is set but on_error is {self.on_error!r}")
        return self


class KafkaSinkSection(Model):
    bootstrap: str = Field(min_length=1)
    topic: str = Field(pattern=NAME)
    partitions: int = Field(1, gt=0)  # used only when eos creates the topic (create_topic: true)
    create_topic: bool = False
    config: dict[str, ClientValue] = Field(default_factory=dict)

    def client(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.config}


class KafkaSinkEntry(SinkEntry):
    name: str = Field(pattern=SINK_NAME)
    input: str | None = Field(None, pattern=VIEW)
    kafka: KafkaSinkSection
    key: str | None = None  # SQL expression over the input's columns
    value: str | None = None  # SQL expression; default: all columns (json/avro) or `value`
    headers: str | None = None  # SQL expression: array<struct<key: string, value: binary>>
    key_format: Format = FormatConfig(type="string")
    value_format: Format = FormatConfig(type="json")
    transactional_id_prefix: str | None = Field(None, pattern=NAME)

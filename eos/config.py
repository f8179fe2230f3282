"""The pipeline file: YAML validated into typed, immutable config.

Errors name the file, line and field and say what is wrong; unknown fields get suggestions.
Client settings (SASL/SSL...) pass through to librdkafka; `${VAR}` pulls secrets from the
environment, and `redacted()` masks them wherever config is shown.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from eos.errors import ConfigError
from eos.yamlsource import LoadedYaml, load_yaml, parse_yaml

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
VIEW = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"
SECRET_KEY = re.compile(r"(?i)(password|secret|token|jaas|credential|apikey|api\.key)")
ClientValue = str | int | float | bool

_UNITS = {
    **dict.fromkeys(("ms", "msec", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def parse_duration(value: Any) -> float:
    """'500ms', '2s', '1 minute', 3 (seconds) -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 500ms, 2s or 1 minute")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value).lower())
        if not match or match.group(2) not in _UNITS:
            raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 2s, 1m or '1 minute'")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Duration = Annotated[float, BeforeValidator(parse_duration)]


# ---------------------------------------------------------------------------------------------
# Formats (keys and values)
# ---------------------------------------------------------------------------------------------


class FormatConfig(Model):
    """How bytes map to columns: raw bytes, UTF-8 string, JSON, or Avro."""

    type: Literal["raw", "string", "json", "avro"] = "raw"
    schema_file: str | None = Field(None, alias="schema")  # .avsc (avro, json) file
    reader_schema: str | None = None  # avro: the schema to read as (evolution)
    registry: str | None = None  # Schema Registry URL, or file:DIR (wire format: magic byte + id)
    subject: str | None = None

    @model_validator(mode="after")
    def _schema_fits_type(self) -> FormatConfig:
        if self.type in ("raw", "string") and (self.schema_file or self.registry or self.reader_schema):
            raise ValueError(f"format {self.type} takes no schema")
        if self.type == "avro" and not (self.schema_file or self.registry):
            raise ValueError("format avro needs `schema:` (an .avsc file) or `registry:`")
        if self.type == "json" and (self.registry or self.reader_schema):
            raise ValueError("format json takes `schema:` only (registry and reader_schema are for avro)")
        if self.subject and not self.registry:
            raise ValueError("`subject:` names a schema registry subject; it needs `registry:`")
        if self.registry and not self.registry.startswith(("http://", "https://", "file:")):
            raise ValueError(f"registry {self.registry!r}: expected an http(s):// URL or file:DIR")
        return self

    @property
    def has_schema(self) -> bool:
        return bool(self.schema_file or self.registry)


# `value_format: json` is short for `value_format: {type: json}`.
Format = Annotated[FormatConfig, BeforeValidator(lambda v: {"type": v} if isinstance(v, str) else v)]


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------

StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[int, int]]


class KafkaSourceConfig(Model):
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


class WatermarkConfig(Model):
    column: str
    delay: Duration


class SourceConfig(Model):
    name: str = Field(pattern=VIEW)
    kafka: KafkaSourceConfig
    key_format: Format = FormatConfig()
    value_format: Format = FormatConfig()
    watermark: WatermarkConfig | None = None
    on_error: Literal["fail", "skip", "dlq"] = "fail"
    dlq_topic: str | None = Field(None, pattern=NAME)

    @model_validator(mode="after")
    def _dlq(self) -> SourceConfig:
        for which, fmt in (("key_format", self.key_format), ("value_format", self.value_format)):
            if fmt.type == "json" and not fmt.has_schema:
                raise ValueError(f"{which}: decoding json needs `schema:` (an .avsc file describing the records)")
        if self.on_error == "dlq" and not self.dlq_topic:
            raise ValueError("on_error: dlq needs dlq_topic")
        if self.on_error != "dlq" and self.dlq_topic:
            raise ValueError(f"dlq_topic is set but on_error is {self.on_error!r}")
        return self


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


class TransformConfig(Model):
    name: str = Field(pattern=VIEW)
    sql: str | None = None
    python: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    input: str | None = Field(None, pattern=VIEW)
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_kind(self) -> TransformConfig:
        if (self.sql is None) == (self.python is None):
            raise ValueError("a transform has exactly one of `sql:` or `python: module:function`")
        if self.sql is not None and (self.input or self.args):
            raise ValueError("`input` and `args` belong to python transforms; SQL names its views itself")
        return self


# ---------------------------------------------------------------------------------------------
# Sinks
# ---------------------------------------------------------------------------------------------


class KafkaSinkConfig(Model):
    bootstrap: str = Field(min_length=1)
    topic: str = Field(pattern=NAME)
    partitions: int = Field(1, gt=0)  # used only when eos creates the topic (create_topic: true)
    create_topic: bool = False
    config: dict[str, ClientValue] = Field(default_factory=dict)


class SinkConfig(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
    input: str | None = Field(None, pattern=VIEW)
    kafka: KafkaSinkConfig
    key: str | None = None  # SQL expression over the input's columns
    value: str | None = None  # SQL expression; default: all columns (json/avro) or `value`
    headers: str | None = None  # SQL expression: array<struct<key: string, value: binary>>
    key_format: Format = FormatConfig(type="string")
    value_format: Format = FormatConfig(type="json")
    transactional_id_prefix: str | None = Field(None, pattern=NAME)


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


class EpochConfig(Model):
    """Epochs are Spark micro-batches; these are the seed's checkpoint knobs."""

    mode: Literal["exactly-once", "at-least-once"] = "exactly-once"
    trigger: str = "1s"  # a processing-time interval, or "available-now" (drain what exists, stop)
    min_pause: Duration = 0.0
    timeout: Duration = 300.0
    tolerable_failures: int = Field(3, ge=0)
    slots: int | None = Field(None, gt=0, le=1024)  # sink slots; fixed for the checkpoint's life
    output_mode: Literal["append", "update"] = "append"

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, value: str) -> str:
        if value != "available-now":
            parse_duration(value)
        return value

    @property
    def trigger_seconds(self) -> float | None:
        return None if self.trigger == "available-now" else parse_duration(self.trigger)


class SparkConfig(Model):
    master: str | None = None  # default local[*] (and whatever spark-submit chose)
    conf: dict[str, ClientValue] = Field(default_factory=dict)


class LedgerConfig(Model):
    topic: str | None = Field(None, pattern=NAME)  # default eos-ledger-<pipeline name>


class CoordinatorConfig(Model):
    """Where the driver listens for the sink slots' votes (must be reachable from executors)."""

    host: str | None = None  # default: spark.driver.host
    port: int = Field(0, ge=0, le=65535)  # 0: any free port


class MetricsConfig(Model):
    port: int | None = Field(None, ge=0, le=65535)  # Prometheus endpoint on the driver; off if unset


class PipelineConfig(Model):
    name: str = Field(pattern=NAME)
    checkpoint: str = Field(min_length=1)
    epochs: EpochConfig = EpochConfig()
    sources: list[SourceConfig] = Field(min_length=1)
    transforms: list[TransformConfig] = Field(default_factory=list)
    sinks: list[SinkConfig] = Field(min_length=1)
    spark: SparkConfig = SparkConfig()
    ledger: LedgerConfig = LedgerConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _names_and_references(self) -> PipelineConfig:
        views: list[str] = []
        for kind, name in [("source", s.name) for s in self.sources] + [("transform", t.name) for t in self.transforms]:
            if name in views:
                raise ValueError(f"{kind} name {name!r} is used twice (sources and transforms share one namespace)")
            views.append(name)
        seen: list[str] = [s.name for s in self.sources]
        for transform in self.transforms:
            if transform.input and transform.input not in seen:
                raise ValueError(f"transform {transform.name!r}: input {transform.input!r} is not defined before it")
            seen.append(transform.name)
        sink_names = [s.name for s in self.sinks]
        if len(set(sink_names)) != len(sink_names):
            raise ValueError("two sinks have the same name")
        for sink in self.sinks:
            if sink.input and sink.input not in views:
                raise ValueError(f"sink {sink.name!r}: input {sink.input!r} is not a source or transform")
        return self

    # -- derived names ---------------------------------------------------------------------
    @property
    def last_view(self) -> str:
        return self.transforms[-1].name if self.transforms else self.sources[-1].name

    def sink_input(self, sink: SinkConfig) -> str:
        return sink.input or self.last_view

    def transactional_id(self, sink: SinkConfig, slot: int) -> str:
        return f"{sink.transactional_id_prefix or self.name}-{sink.name}-{slot}"

    @property
    def ledger_topic(self) -> str:
        return self.ledger.topic or f"eos-ledger-{self.name}"

    @property
    def consumer_group(self) -> str:
        return f"eos-{self.name}"

    def checkpoint_path(self, base_dir: Path | None = None) -> str:
        if "://" in self.checkpoint or self.checkpoint.startswith("/") or base_dir is None:
            return self.checkpoint
        return str((base_dir / self.checkpoint).resolve())


# ---------------------------------------------------------------------------------------------
# Loading, errors, redaction
# ---------------------------------------------------------------------------------------------


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at `path` (for suggestions on unknown fields)."""
    model: Any = PipelineConfig
    for part in path:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field_info = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field_info is None:
            return None
        annotation = field_info.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            for inner in (candidate, *getattr(candidate, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
                    break
            else:
                continue
            break
        else:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _describe(error: Mapping[str, Any], loaded: LoadedYaml) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    dotted = ".".join(str(p) for p in loc) or "(top level)"
    where = loaded.where(loc)
    if error["type"] == "extra_forbidden":
        model = _model_at(loc[:-1])
        known = sorted({f.alias or name for name, f in model.model_fields.items()} if model else set())
        close = difflib.get_close_matches(str(loc[-1]), known, n=3, cutoff=0.5)
        suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        allowed = f" (known fields: {', '.join(known)})" if known and not close else ""
        return f"{where}: unknown field {dotted!r}{suggestion}{allowed}"
    if error["type"] == "missing":
        return f"{where}: missing required field {dotted!r}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {dotted}: {message}"


def pipeline_from_yaml(loaded: LoadedYaml) -> PipelineConfig:
    if not isinstance(loaded.data, dict):
        raise ConfigError(f"{loaded.file}: a pipeline file is a mapping (name:, checkpoint:, sources:, sinks:, ...)")
    try:
        return PipelineConfig.model_validate(loaded.data)
    except ValidationError as exc:
        problems = [_describe(e, loaded) for e in exc.errors()]
        unique = list(dict.fromkeys(problems))
        raise ConfigError(
            f"{loaded.file}: {len(unique)} problem{'s' if len(unique) > 1 else ''}:\n  " + "\n  ".join(unique)
        ) from None


def load_pipeline(path: str | Path, env: Mapping[str, str] | None = None) -> PipelineConfig:
    return pipeline_from_yaml(load_yaml(path, env))


def parse_pipeline(text: str, env: Mapping[str, str] | None = None) -> PipelineConfig:
    return pipeline_from_yaml(parse_yaml(text, "<string>", env))


def redacted(value: Any, key: str = "") -> Any:
    """A copy fit to print or log: values under secret-looking keys are masked."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    if isinstance(value, dict):
        return {k: ("***" if SECRET_KEY.search(str(k)) else redacted(v, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    return value

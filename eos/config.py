"""The pipeline file: YAML validated into typed, immutable config.

The core owns the pipeline's shape (name, checkpoint, epochs, transforms, Spark) and the part of
every source and sink entry that every kind has (name, input, watermark, on_error). The rest of
an entry belongs to its connector, named by the entry's section (`kafka:`, `postgres:`): its
model comes from the connector registered for that kind (eos.registry), so a new sink brings its
own config model and the core never imports it.

Errors name the file, line and field and say what is wrong; unknown fields get suggestions.
Client settings (SASL/SSL...) pass through to the clients; `${VAR}` pulls secrets from the
environment, and `redacted()` masks them wherever config is shown.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
)
from pydantic import model_validator as _model_validator

from eos import registry
from eos.errors import ConfigError
from eos.model import DURATION_SCHEMA, NAME, VIEW, ClientValue, Duration, Model, parse_duration, redacted
from eos.protocol.sink import SinkEntry
from eos.protocol.source import SourceEntry
from eos.yamlsource import LoadedYaml, load_yaml, parse_yaml

__all__ = [
    "PipelineConfig",
    "PipelineHeader",
    "load_pipeline",
    "parse_duration",
    "parse_pipeline",
    "pipeline_from_yaml",
    "redacted",
]


class TransformConfig(Model):
    name: str = Field(pattern=VIEW)
    sql: str | None = None
    python: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    input: str | None = Field(None, pattern=VIEW)
    args: dict[str, Any] = Field(default_factory=dict)

    @_model_validator(mode="after")
    def _one_kind(self) -> TransformConfig:
        if (self.sql is None) == (self.python is None):
            raise ValueError("a transform has exactly one of `sql:` or `python: module:function`")
        if self.sql is not None and (self.input or self.args):
            raise ValueError("`input` and `args` belong to python transforms; SQL names its views itself")
        return self


# An epoch's trigger: a duration, or available-now (for editors; eos parses it with parse_duration).
TRIGGER_SCHEMA = {
    "anyOf": [*DURATION_SCHEMA["anyOf"], {"const": "available-now"}],
    "description": "the interval between epochs (500ms, 1s, 1 minute), or available-now: drain the input, then stop",
}


class EpochConfig(Model):
    """Epochs are Spark micro-batches; these are the checkpointing knobs."""

    mode: Literal["exactly-once", "at-least-once"] = "exactly-once"
    # a processing-time interval, or "available-now" (drain what exists, then stop)
    trigger: Annotated[str, WithJsonSchema(TRIGGER_SCHEMA, mode="validation")] = "1s"
    min_pause: Duration = 0.0
    timeout: Duration = 300.0
    tolerable_failures: int = Field(3, ge=0)
    slots: int | None = Field(None, gt=0, le=1024)  # tasks (sink slots) per epoch; default: Spark's cores
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
    """The driver's Prometheus endpoint, off unless a port is set. It answers anyone who reaches
    it, so it listens on loopback unless `host` says otherwise (0.0.0.0: every interface, for a
    Prometheus on another machine or container)."""

    host: str = Field("127.0.0.1", min_length=1)
    port: int | None = Field(None, ge=0, le=65535)


class PipelineHeader(Model):
    """What a pipeline is besides its sources, transforms and sinks: the part the Python API's
    `eos.Pipeline(...)` takes as arguments and a pipeline file as its top-level fields."""

    name: str = Field(pattern=NAME)
    checkpoint: str = Field(min_length=1)
    epochs: EpochConfig = EpochConfig()
    spark: SparkConfig = SparkConfig()
    ledger: LedgerConfig = LedgerConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    metrics: MetricsConfig = MetricsConfig()
    # Where the values came from (a pipeline file), for errors that name its lines; None in code.
    _loaded: LoadedYaml | None = PrivateAttr(default=None)

    def where(self, path: tuple[str | int, ...]) -> str | None:
        """`file:line` of a value of the pipeline file (None for a pipeline built in code)."""
        return self._loaded.where(path) if self._loaded is not None else None

    @property
    def loaded(self) -> LoadedYaml | None:
        return self._loaded

    # -- derived names ---------------------------------------------------------------------
    @property
    def ledger_topic(self) -> str:
        return self.ledger.topic or f"eos-ledger-{self.name}"

    @property
    def consumer_group(self) -> str:
        return f"eos-{self.name}"

    @property
    def exactly_once(self) -> bool:
        return self.epochs.mode == "exactly-once"

    def checkpoint_path(self, base_dir: Path | None = None) -> str:
        if "://" in self.checkpoint or self.checkpoint.startswith("/") or base_dir is None:
            return self.checkpoint
        if self.checkpoint.startswith("~"):
            return str(Path(self.checkpoint).expanduser())
        return str((base_dir / self.checkpoint).resolve())


class PipelineBase(PipelineHeader):
    transforms: list[TransformConfig] = Field(default_factory=list)
    # Set by the kind-specific model below; listed here for type checkers.
    sources: list[Any]
    sinks: list[Any]

    @_model_validator(mode="after")
    def _names_and_references(self) -> PipelineBase:
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

    @property
    def last_view(self) -> str:
        return self.transforms[-1].name if self.transforms else self.sources[-1].name

    def sink_input(self, sink: SinkEntry) -> str:
        return sink.input or self.last_view


# A pipeline's config type; its sources and sinks are the registered kinds' models.
PipelineConfig = PipelineBase


def kind_of(entry: Any) -> str | None:
    """The kind an entry names: its one section that is a registered connector kind."""
    if isinstance(entry, Mapping):
        kinds = {**registry.source_kinds(), **registry.sink_kinds()}
        found = [k for k in kinds if k in entry]
        return found[0] if len(found) == 1 else None
    for kinds in (registry.source_kinds(), registry.sink_kinds()):
        for kind, connector in kinds.items():
            if isinstance(entry, connector.entry_model):
                return kind
    return None


def _entries(kinds: Mapping[str, type[Model]], what: str) -> Any:
    if not kinds:
        raise ConfigError(f"no {what} connectors are installed (entry point group {registry.GROUP})")
    if len(kinds) == 1:
        return next(iter(kinds.values()))
    members = tuple(Annotated[model, Tag(kind)] for kind, model in kinds.items())
    return Annotated[
        Union[members],  # noqa: UP007 - a runtime tuple of members
        Discriminator(
            kind_of,
            custom_error_type="entry_kind",
            custom_error_message=f"a {what} names its kind with exactly one section: {' or '.join(sorted(kinds))}",
        ),
    ]


@cache
def pipeline_model() -> type[PipelineBase]:
    """The pipeline model with the registered connectors' entry models (built once)."""
    sources = {k: c.entry_model for k, c in registry.source_kinds().items()}
    sinks = {k: c.entry_model for k, c in registry.sink_kinds().items()}
    return create_model(  # type: ignore[call-overload]
        "PipelineConfig",
        __base__=PipelineBase,
        sources=(list[_entries(sources, "source")], Field(min_length=1)),
        sinks=(list[_entries(sinks, "sink")], Field(min_length=1)),
    )


# ---------------------------------------------------------------------------------------------
# Loading, errors
# ---------------------------------------------------------------------------------------------


def _without_tags(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str | None]:
    """Pydantic puts the chosen kind into an error's location (sinks.0.kafka.topic becomes
    sinks.0.kafka.kafka.topic): drop it, and say which kind it was."""
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    for i in range(len(loc) - 2):
        if loc[i] in ("sources", "sinks") and isinstance(loc[i + 1], int):
            kinds = registry.source_kinds() if loc[i] == "sources" else registry.sink_kinds()
            if len(kinds) > 1 and loc[i + 2] in kinds:  # only a choice among kinds is tagged
                return loc[: i + 2] + loc[i + 3 :], loc[i + 2]
    return loc, None


def _model_at(path: tuple[Any, ...], kind: str | None) -> type[BaseModel] | None:
    """The model class that owns the field at `path` (for suggestions on unknown fields)."""
    model: Any = pipeline_model()
    for index, part in enumerate(path):
        if isinstance(part, int):
            if index >= 1 and path[index - 1] in ("sources", "sinks"):
                owner = registry.source_kinds() if path[index - 1] == "sources" else registry.sink_kinds()
                chosen = owner.get(kind or "") or (next(iter(owner.values())) if len(owner) == 1 else None)
                if chosen is None:
                    return None
                model = chosen.entry_model
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field_info = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field_info is None:
            return None
        model = _inner_model(field_info.annotation)
        if model is None and part not in ("sources", "sinks"):
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        for inner in (candidate, *getattr(candidate, "__args__", ())):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def _describe(error: Mapping[str, Any], loaded: LoadedYaml) -> str:
    loc, kind = _without_tags(tuple(error["loc"]))
    dotted = ".".join(str(p) for p in loc) or "(top level)"
    where = loaded.where(loc)
    if error["type"] == "extra_forbidden":
        model = _model_at(loc[:-1], kind)
        known = sorted({f.alias or name for name, f in model.model_fields.items()} if model else set())
        close = difflib.get_close_matches(str(loc[-1]), known, n=3, cutoff=0.5)
        suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        allowed = f" (known fields: {', '.join(known)})" if known and not close else ""
        return f"{where}: unknown field {dotted!r}{suggestion}{allowed}"
    if error["type"] == "missing":
        return f"{where}: missing required field {dotted!r}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {dotted}: {message}"


def pipeline_from_yaml(loaded: LoadedYaml) -> PipelineBase:
    if not isinstance(loaded.data, dict):
        raise ConfigError(f"{loaded.file}: a pipeline file is a mapping (name:, checkpoint:, sources:, sinks:, ...)")
    try:
        config = pipeline_model().model_validate(loaded.data)
    except ValidationError as exc:
        problems = [_describe(e, loaded) for e in exc.errors()]
        unique = list(dict.fromkeys(problems))
        raise ConfigError(
            f"{loaded.file}: {len(unique)} problem{'s' if len(unique) > 1 else ''}:\n  " + "\n  ".join(unique)
        ) from None
    config._loaded = loaded
    return config


def load_pipeline(path: str | Path, env: Mapping[str, str] | None = None) -> PipelineBase:
    return pipeline_from_yaml(load_yaml(path, env))


def parse_pipeline(text: str, env: Mapping[str, str] | None = None) -> PipelineBase:
    return pipeline_from_yaml(parse_yaml(text, "<string>", env))


__all__ += ["SinkEntry", "SourceEntry", "TransformConfig"]

"""From a validated pipeline config to one streaming DataFrame: the epoch's rows for every sink.

sources -> decoded, watermarked SQL views -> transforms (SQL or Python) -> each sink's rows ->
one union, every sink's rows in a struct column of their own and tagged with the sink's index
(eos.protocol.plan), dead-letter rows included. One streaming query and one checkpoint: every
epoch's output, over all sinks, is decided and committed as one unit. (Readers may still see
part of an epoch while its commit phase runs, or while a crashed driver is down: commits are per
sink and slot. See docs/EXACTLY_ONCE.md.)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from eos import registry
from eos.config import PipelineConfig, kind_of
from eos.errors import ConfigError, EosError
from eos.model import redacted
from eos.protocol.plan import SINK_TAG, SinkPlan, sink_column
from eos.protocol.sink import PipelineInfo, Recovery, SinkConnector
from eos.protocol.source import ERROR, POISON_COLUMNS, SourceConnector, StreamOptions


def load_function(reference: str):
    module_name, _, function_name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"python transform {reference!r}: cannot import {module_name!r}: {exc}") from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"python transform {reference!r}: {module_name} has no function {function_name!r}")
    return function


@dataclass
class Connectors:
    sources: list[SourceConnector]
    sinks: list[SinkConnector]  # the configured sinks, then each source's dead-letter queue


def connectors(config: PipelineConfig, pipeline: PipelineInfo) -> Connectors:
    """The connector of every entry, found by its kind."""
    sources = [registry.source_kinds()[kind_of(entry)](entry, pipeline) for entry in config.sources]
    sinks = [registry.sink_kinds()[kind_of(entry)](entry, pipeline) for entry in config.sinks]
    sinks += [dlq for dlq in (source.dead_letters() for source in sources) if dlq is not None]
    return Connectors(sources, sinks)


def replay_config(config: PipelineConfig, found: Connectors, parallelism: int) -> dict[str, Any]:
    """Everything that decides what a replay of an epoch writes: pinned while an epoch is pending.

    Credentials are not part of it: a replay must write the same rows, not log in the same way.
    The connectors leave out how they reach their systems (replay_identity), and whatever else
    holds a secret (a python transform's `api_token:` argument, a password inside a value) is
    masked here, so the checkpoint never holds one and a rotated password changes nothing."""
    return redacted(
        {
            "sources": [source.replay_identity() for source in found.sources],
            "transforms": [t.model_dump(mode="json") for t in config.transforms],
            "sinks": [{"kind": type(sink).kind, **sink.replay_identity()} for sink in found.sinks],
            "parallelism": parallelism,
            "output_mode": config.epochs.output_mode,
            "mode": config.epochs.mode,
        }
    )


@dataclass
class BuiltPipeline:
    stream: Any  # the union of every sink's rows
    plans: tuple[SinkPlan, ...]  # in the union's order (a sink's index is its tag)


def build(
    spark: Any,
    config: PipelineConfig,
    found: Connectors,
    pins: dict[str, dict[str, Any]],
    options: StreamOptions,
) -> BuiltPipeline:
    from pyspark.sql import functions as F

    # Every sink's rows are a branch of one union. With exchange reuse on, Spark (4.x) plans the
    # second of two branches that share a stateful subplan (two sinks of one windowed aggregate,
    # append mode) onto the first one's shuffle, and that branch then emits nothing: its sink
    # silently misses every row. Each branch must run its own plan.
    spark.conf.set("spark.sql.exchange.reuse", "false")
    parts: list[tuple[str, Any, Any]] = []  # (sink name, its rows, its writer or None)
    poison_parts: list[tuple[str, Any, Any]] = []
    dead_letters = {sink.name: sink for sink in found.sinks[len(config.sinks) :]}
    for source in found.sources:
        rows = source.stream(spark, pins[source.name], options)
        view = rows.filter(F.col(ERROR).isNull()).drop(*POISON_COLUMNS)
        watermark = source.entry.watermark
        if watermark is not None:
            if watermark.column not in view.columns:
                raise ConfigError(
                    f"source {source.name}: watermark column {watermark.column!r} is not one of "
                    f"{', '.join(view.columns)}"
                )
            view = view.withWatermark(watermark.column, f"{int(watermark.delay * 1000)} milliseconds")
        view.createOrReplaceTempView(source.name)
        # Poison rows come from a second scan of the same epoch's input (Spark's offset log has an
        # entry per scan, so it exists in every on_error mode: switching modes keeps the
        # checkpoint's shape). Under `fail` it reads nothing: the read task stops at the first.
        poison = source.poison_stream(spark, pins[source.name], options).filter(F.col(ERROR).isNotNull())
        if source.entry.on_error == "fail":
            poison_parts.append((f"{source.name}.poison", poison.select(F.lit(1).alias("n")), None))
        elif source.entry.on_error == "skip":
            poison_parts.append((f"{source.name}.skipped", poison.select(F.lit(1).alias("n")), None))
        elif source.entry.on_error == "dlq":
            sink = dead_letters[f"{source.name}.dlq"]
            poison_parts.append((sink.name, sink.rows(poison), sink))
    _transforms(spark, config)
    for sink, entry in zip(found.sinks, config.sinks, strict=False):
        try:
            parts.append((sink.name, sink.rows(spark.table(config.sink_input(entry))), sink))
        except EosError:
            raise
        except Exception as exc:
            raise ConfigError(f"sink {sink.name!r}: {str(exc).splitlines()[0]}") from exc
    tagged, plans = [], []
    for index, (name, rows, sink) in enumerate(parts + poison_parts):
        tagged.append(rows.select(F.lit(index).alias(SINK_TAG), F.struct(*rows.columns).alias(sink_column(index))))
        by_owner = sink is not None and type(sink).recovery is Recovery.REPLAY
        plans.append(SinkPlan(name, index, sink.writer() if sink is not None else None, by_owner))
    stream = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
    return BuiltPipeline(stream, tuple(plans))


def _transforms(spark: Any, config: PipelineConfig) -> None:
    previous = config.sources[-1].name
    for transform in config.transforms:
        try:
            if transform.sql is not None:
                result = spark.sql(transform.sql)
            else:
                result = load_function(transform.python)(spark.table(transform.input or previous), **transform.args)
        except EosError:
            raise
        except Exception as exc:
            raise ConfigError(f"transform {transform.name!r}: {str(exc).splitlines()[0]}") from exc
        if not getattr(result, "isStreaming", False):
            raise ConfigError(f"transform {transform.name!r} must return a streaming DataFrame derived from its input")
        result.createOrReplaceTempView(transform.name)
        previous = transform.name


def pipeline_info(config: PipelineConfig, checkpoint_id: str, base_dir: Path | None) -> PipelineInfo:
    return PipelineInfo(
        name=config.name,
        checkpoint_id=checkpoint_id,
        exactly_once=config.exactly_once,
        epoch_timeout_s=config.epochs.timeout,
        base_dir=base_dir,
        ledger=config.ledger_topic,
    )

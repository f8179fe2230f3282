"""From a validated pipeline config to one streaming DataFrame of sink rows.

sources -> decoded, watermarked SQL views -> transforms (SQL or Python) -> each sink's rows,
encoded -> one union (sink, key, value, headers), dead-letter rows included. One streaming
query, one checkpoint, and every sink's output of an epoch is committed together.
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import Any

from eos_connectors.formats import decode_source, encode_sink, poison_sink_name, source_view, split_poison
from eos_connectors.kafka.clients import only_connection_settings
from eos_connectors.kafka.sink import SinkTarget
from eos_connectors.kafka.source import FORMAT_NAME, KafkaSource, SourceOptions

from eos.config import KafkaSinkConfig, KafkaSourceConfig, PipelineConfig
from eos.errors import ConfigError, EosError
from eos.failpoints import DISARMED, Failpoints
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta


def client_config(kafka: KafkaSourceConfig | KafkaSinkConfig) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.bootstrap, **kafka.config}


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


def sink_targets(config: PipelineConfig) -> dict[str, SinkTarget]:
    """Every sink of the pipeline, dead-letter queues and skip counters included."""
    targets = {
        sink.name: SinkTarget(
            sink.name,
            sink.kafka.topic,
            client_config(sink.kafka),
            f"{sink.transactional_id_prefix or config.name}-{sink.name}",
        )
        for sink in config.sinks
    }
    for source in config.sources:
        if source.on_error == "fail":
            continue
        name = poison_sink_name(source)
        targets[name] = SinkTarget(
            name,
            source.dlq_topic if source.on_error == "dlq" else None,
            only_connection_settings(client_config(source.kafka)),
            f"{config.name}-{name.replace('.', '-')}",
        )
    return targets


@dataclass
class BuiltPipeline:
    stream: Any  # streaming DataFrame (sink, key, value, headers)
    targets: dict[str, SinkTarget]


def build(
    spark,
    config: PipelineConfig,
    meta: CheckpointMeta,
    base_dir: Path | None = None,
    failpoints: Failpoints = DISARMED,
) -> BuiltPipeline:
    spark.dataSource.register(KafkaSource)
    plans = Checkpoint(config.checkpoint_path(base_dir)).meta_dir / "plans"
    run_id = uuid.uuid4().hex[:12]
    rows = []
    for source in config.sources:
        kafka = source.kafka
        options = SourceOptions(
            name=source.name,
            client=client_config(kafka),
            topics=list(kafka.topics),
            starting=meta.sources[source.name]["starting"],
            max_records_per_epoch=kafka.max_records_per_epoch,
            max_records_per_task=kafka.max_records_per_task,
            read_committed=kafka.isolation == "read_committed",
            on_out_of_range=kafka.on_out_of_range,
            group_id=f"{config.consumer_group}.{source.name}",
            plan_dir=str(plans / source.name),
            run_id=run_id,
            failpoints=[p.spec() for p in failpoints.points if p.name == "source.read"],
            failpoint_state=failpoints.state_dir,
            driver_pgid=failpoints.driver_pgid,
        )
        # Two Spark sources per config source, whatever on_error says (see split_poison): the rows
        # of the view, and the poison rows (which read nothing under `fail`).
        view_branch, poison_branch = (
            spark.readStream.format(FORMAT_NAME).option("eos.source", branch.to_json()).load()
            for branch in (
                options,
                replace(options, follower=True, reads=source.on_error != "fail", group_id=None),
            )
        )
        good, poison = split_poison(
            decode_source(view_branch, source, base_dir),
            decode_source(poison_branch, source, base_dir),
            source,
            config.name,
        )
        view = source_view(good, source)
        if source.watermark is not None:
            if source.watermark.column not in view.columns:
                raise ConfigError(
                    f"source {source.name}: watermark column {source.watermark.column!r} is not one of "
                    f"{', '.join(view.columns)}"
                )
            view = view.withWatermark(source.watermark.column, f"{int(source.watermark.delay * 1000)} milliseconds")
        view.createOrReplaceTempView(source.name)
        if poison is not None:
            rows.append(poison)
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
    for sink in config.sinks:
        try:
            rows.append(encode_sink(spark.table(config.sink_input(sink)), sink, base_dir))
        except EosError:
            raise
        except Exception as exc:
            raise ConfigError(f"sink {sink.name!r}: {str(exc).splitlines()[0]}") from exc
    stream = reduce(lambda a, b: a.unionByName(b), rows)
    return BuiltPipeline(stream, sink_targets(config))

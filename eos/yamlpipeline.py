"""The pipeline file as a front end to `eos.Pipeline`: the same sources and sinks, declared from
the file's entries, with its transforms in between.

sources -> decoded, watermarked SQL views (named as the sources) -> transforms, each a view of
its own: `sql:` over the views, or `python: module:function` called with its input view's
DataFrame (and `args`) -> each sink takes its `input:` view (default: the last one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eos.config import PipelineConfig
from eos.errors import ConfigError, EosError
from eos.pipeline import Pipeline, load_function, spark_message


def build_pipeline(
    config: PipelineConfig, base_dir: Path | None, spark: Any = None, failpoints: list[str] | None = None
) -> Pipeline:
    pipeline = Pipeline.from_header(config, base_dir, spark, failpoints or [])
    try:
        for entry in [*config.sources, *config.sinks]:
            pipeline.check(entry)
        for entry in config.sources:
            pipeline.source(entry).createOrReplaceTempView(entry.name)
        pipeline.transforms = list(config.transforms)
        _transforms(pipeline.spark, config)
        for entry in config.sinks:
            pipeline.sink(pipeline.spark.table(config.sink_input(entry)), entry)
    except BaseException:
        pipeline.close()
        raise
    return pipeline


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
            raise ConfigError(f"transform {transform.name!r}: {spark_message(exc)}") from exc
        if not getattr(result, "isStreaming", False):
            raise ConfigError(f"transform {transform.name!r} must return a streaming DataFrame derived from its input")
        result.createOrReplaceTempView(transform.name)
        previous = transform.name

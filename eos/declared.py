"""What a pipeline declares, read without running it: the connector of every entry, the replay
config (what a replay of an epoch must repeat), what every connector may know about the pipeline.
Shared by the Python API (eos.pipeline), the start-up (eos.launch) and the tools that read a
pipeline file without running it (status, reset, verify)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eos import registry
from eos.config import PipelineConfig, PipelineHeader, kind_of
from eos.errors import ConfigError
from eos.model import redacted
from eos.protocol.sink import PipelineInfo, SinkConnector
from eos.protocol.source import SourceConnector


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
    """The connector of every entry, found by its kind (for tools that read a pipeline without running it)."""
    sources = [registry.source_kinds()[kind_of(entry)](entry, pipeline) for entry in config.sources]
    sinks = [registry.sink_kinds()[kind_of(entry)](entry, pipeline) for entry in config.sinks]
    sinks += [dlq for dlq in (source.dead_letters() for source in sources) if dlq is not None]
    return Connectors(sources, sinks)


def replay_config(
    config: PipelineConfig, found: Connectors, parallelism: int, inputs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Everything that decides what a replay of an epoch writes: pinned while an epoch is pending.
    A pipeline file names its transforms; a pipeline built in code has only the schema of what
    each sink receives (`inputs`) to show for its DataFrame code.

    Credentials are not part of it: a replay must write the same rows, not log in the same way.
    The connectors leave out how they reach their systems (replay_identity), and whatever else
    holds a secret (a python transform's `api_token:` argument, a password inside a value) is
    masked here, so the checkpoint never holds one and a rotated password changes nothing."""
    replay = {
        "sources": [source.replay_identity() for source in found.sources],
        "transforms": [t.model_dump(mode="json") for t in config.transforms],
        "sinks": [{"kind": type(sink).kind, **sink.replay_identity()} for sink in found.sinks],
        "parallelism": parallelism,
        "output_mode": config.epochs.output_mode,
        "mode": config.epochs.mode,
    }
    if inputs:
        replay["inputs"] = dict(inputs)
    return redacted(replay)


def pipeline_info(config: PipelineHeader, checkpoint_id: str, base_dir: Path | None) -> PipelineInfo:
    return PipelineInfo(
        name=config.name,
        checkpoint_id=checkpoint_id,
        exactly_once=config.exactly_once,
        epoch_timeout_s=config.epochs.timeout,
        base_dir=base_dir,
        ledger=config.ledger_topic,
    )

"""Connectors by kind. The core never imports a connector: a pipeline entry names its kind by
its section (`kafka:`, `postgres:`), and the connector for that kind is found here, among the
entry points of the group `eos.connectors` (pyproject.toml). A new sink is one module that
defines a `SinkConnector` plus its entry model, and one entry point line."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from eos.errors import ConfigError
from eos.protocol.sink import SinkConnector
from eos.protocol.source import SourceConnector

GROUP = "eos.connectors"


@dataclass(frozen=True)
class Connector:
    """What one connector module offers (an entry point points at such an object)."""

    kind: str
    source: type[SourceConnector] | None = None
    sink: type[SinkConnector] | None = None


@cache
def connectors() -> dict[str, Connector]:
    found: dict[str, Connector] = {}
    for entry in entry_points(group=GROUP):
        connector = entry.load()
        if not isinstance(connector, Connector) or connector.kind != entry.name:
            raise ConfigError(f"entry point {entry.name} = {entry.value} is not an eos Connector named {entry.name!r}")
        found[entry.name] = connector
    return found


def source_kinds() -> dict[str, type[SourceConnector]]:
    return {kind: c.source for kind, c in connectors().items() if c.source is not None}


def sink_kinds() -> dict[str, type[SinkConnector]]:
    return {kind: c.sink for kind, c in connectors().items() if c.sink is not None}

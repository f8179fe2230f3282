"""The Kafka connector: the re-settable source, the two-phase-commit sink, and the control log.

Registered as the connector of kind `kafka` (entry point group `eos.connectors`). For the Python
API it offers `Source(...)` and `Sink(...)`, which build the typed entries a pipeline file's
`kafka:` sections give.

Names load on first access (PEP 562): the Python processes Spark starts for the source's planning
and reading import only `eos_connectors.kafka.reader` and what it needs, not the sink, its
configuration models and the control log. Each query start runs two such processes one after the
other (the scan and the poison scan), so what they import is paid at every start of a pipeline.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eos.api import Connector
    from eos_connectors.kafka.declare import Sink, Source

    connector: Connector

__all__ = ["Sink", "Source", "connector"]


def __getattr__(name: str) -> Any:
    if name in ("Source", "Sink"):
        from eos_connectors.kafka import declare

        value = getattr(declare, name)
    elif name == "connector":
        from eos.api import Connector
        from eos_connectors.kafka.sink import KafkaSink
        from eos_connectors.kafka.source import KafkaSource

        value = Connector("kafka", source=KafkaSource, sink=KafkaSink)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

"""The Kafka connector: the re-settable source, the two-phase-commit sink, and the control log.

Registered as the connector of kind `kafka` (entry point group `eos.connectors`).

`connector` is built on first access (PEP 562): the Python processes Spark starts for the
source's planning and reading import only `eos_connectors.kafka.reader` and what it needs, not
the sink, its configuration models and the control log. Each query start runs two such
processes one after the other (the scan and the poison scan), so what they import is paid at
every start of a pipeline.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name != "connector":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from eos.api import Connector
    from eos_connectors.kafka.sink import KafkaSink
    from eos_connectors.kafka.source import KafkaSource

    connector = Connector("kafka", source=KafkaSource, sink=KafkaSink)
    globals()["connector"] = connector
    return connector

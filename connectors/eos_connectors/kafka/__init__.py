"""The Kafka connector: the re-settable source, the two-phase-commit sink, and the control log.

Registered as the connector of kind `kafka` (entry point group `eos.connectors`).
"""

from eos.api import Connector
from eos_connectors.kafka.sink import KafkaSink
from eos_connectors.kafka.source import KafkaSource

connector = Connector("kafka", source=KafkaSource, sink=KafkaSink)

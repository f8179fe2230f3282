"""The public API of eos for connectors: everything a connector may import from the core.

Connectors (the `eos_connectors` package, or a third party's) import from here only; the core
finds them by kind through `eos.registry` and never imports them. See eos/protocol/sink.py for
what a two-phase-commit sink implements and eos/protocol/source.py for a re-settable source.
"""

from eos.errors import (
    CheckpointError,
    ConfigError,
    DependencyUnavailable,
    DriverFenced,
    EnvironmentProblem,
    EosError,
    Permanent,
    PoisonRecord,
    Retriable,
    SlotAborted,
    SourceFailed,
    crossing,
    to_wire,
)
from eos.failpoints import Failpoints
from eos.failpoints import parse as parse_failpoints
from eos.model import NAME, SECRET_KEY, SINK_NAME, VIEW, ClientValue, Duration, Model, parse_duration, redacted
from eos.paths import eos_home, ops_dir, schemas_dir
from eos.protocol.decision import ControlLog, ControlState, Decision, DriverInfo, Pool, decode, encode
from eos.protocol.ledger import Ledger, LedgerEntry
from eos.protocol.sink import (
    Lease,
    PipelineInfo,
    Prepared,
    Recovery,
    SinkConnector,
    SinkEntry,
    SlotContext,
    SlotWriter,
    WriterFactory,
)
from eos.protocol.source import (
    ERROR,
    POISON_COLUMNS,
    RAW_KEY,
    RAW_VALUE,
    PartitionLag,
    SourceConnector,
    SourceEntry,
    StreamOptions,
    WatermarkConfig,
)
from eos.registry import Connector

__all__ = [
    "ERROR", "NAME", "POISON_COLUMNS", "RAW_KEY", "RAW_VALUE", "SECRET_KEY", "SINK_NAME", "VIEW", "CheckpointError",
    "ClientValue", "ConfigError", "Connector", "ControlLog", "ControlState", "Decision", "DependencyUnavailable",
    "DriverFenced", "DriverInfo", "Duration", "EnvironmentProblem", "EosError", "Failpoints", "Lease", "Ledger",
    "LedgerEntry", "Model", "PartitionLag", "Permanent", "PipelineInfo", "PoisonRecord", "Pool", "Prepared", "Recovery",
    "Retriable", "SinkConnector", "SinkEntry", "SlotAborted", "SlotContext", "SlotWriter", "SourceConnector",
    "SourceEntry", "SourceFailed", "StreamOptions", "WatermarkConfig", "WriterFactory", "crossing", "decode",
    "encode", "eos_home", "ops_dir", "parse_duration", "parse_failpoints", "redacted", "schemas_dir", "to_wire",
]  # fmt: skip

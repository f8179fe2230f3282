"""The public API of eos for connectors: everything a connector may import from the core.

Connectors (the `eos_connectors` package, or a third party's) import from here only; the core
finds them by kind through `eos.registry` and never imports them. See eos/protocol/sink.py for
what a two-phase-commit sink implements and eos/protocol/source.py for a re-settable source.

Names load on first use (PEP 562): Spark starts a fresh Python process for every scan of a
source at every query start, and the read side needs only errors and failpoints, not the
configuration models (pydantic, ~0.1 s to import).
"""

# ruff: noqa: F401  (the imports under TYPE_CHECKING are re-exports, listed in __all__ at run time)

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and editors (re-exports: see __all__)
    from eos.errors import (
        CheckpointError,
        ConfigError,
        DependencyUnavailable,
        DriverFenced,
        EnvironmentProblem,
        EosError,
        Permanent,
        PoisonDecision,
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
    from eos.protocol.barrier import SharedEnds
    from eos.protocol.decision import ControlLog, ControlState, Decision, DriverInfo, Pool, decode, encode
    from eos.protocol.ledger import Ledger, LedgerEntry
    from eos.protocol.poison import recorded as recorded_poison
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

# Where each name lives (the same as the imports above; a test keeps the two equal).
# fmt: off
_MODULES = {
    "eos.errors": (
        "CheckpointError", "ConfigError", "DependencyUnavailable", "DriverFenced", "EnvironmentProblem", "EosError",
        "Permanent", "PoisonDecision", "PoisonRecord", "Retriable", "SlotAborted", "SourceFailed", "crossing",
        "to_wire",
    ),
    "eos.failpoints": ("Failpoints",),
    "eos.model": (
        "NAME", "SECRET_KEY", "SINK_NAME", "VIEW", "ClientValue", "Duration", "Model", "parse_duration", "redacted",
    ),
    "eos.paths": ("eos_home", "ops_dir", "schemas_dir"),
    "eos.protocol.barrier": ("SharedEnds",),
    "eos.protocol.decision": ("ControlLog", "ControlState", "Decision", "DriverInfo", "Pool", "decode", "encode"),
    "eos.protocol.ledger": ("Ledger", "LedgerEntry"),
    "eos.protocol.sink": (
        "Lease", "PipelineInfo", "Prepared", "Recovery", "SinkConnector", "SinkEntry", "SlotContext", "SlotWriter",
        "WriterFactory",
    ),
    "eos.protocol.source": (
        "ERROR", "POISON_COLUMNS", "RAW_KEY", "RAW_VALUE", "PartitionLag", "SourceConnector", "SourceEntry",
        "StreamOptions", "WatermarkConfig",
    ),
    "eos.registry": ("Connector",),
}
# fmt: on
_RENAMED = {
    "parse_failpoints": ("eos.failpoints", "parse"),
    "recorded_poison": ("eos.protocol.poison", "recorded"),
}
_WHERE = {name: (module, name) for module, names in _MODULES.items() for name in names} | _RENAMED

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _WHERE[name]
    value = getattr(import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

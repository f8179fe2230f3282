"""The Delta Lake connector: a two-phase-commit sink on a Delta table's own log (docs/DELTA.md).

Registered as the connector of kind `delta` (entry point group `eos.connectors`). For the Python
API it offers `Sink(...)`, which builds the typed entry a pipeline file's `delta:` section gives.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eos.api import Connector
    from eos_connectors.delta.declare import Sink

    connector: Connector

__all__ = ["Sink", "connector"]


def __getattr__(name: str) -> Any:
    if name == "Sink":
        from eos_connectors.delta.declare import Sink

        value: Any = Sink
    elif name == "connector":
        from eos.api import Connector
        from eos_connectors.delta.sink import DeltaSink

        value = Connector("delta", sink=DeltaSink)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

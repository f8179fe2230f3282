"""The PostgreSQL connector: a two-phase-commit sink on PREPARE TRANSACTION (docs/POSTGRES.md).

Registered as the connector of kind `postgres` (entry point group `eos.connectors`). For the Python
API it offers `Sink(...)`, which builds the typed entry a pipeline file's `postgres:` section gives.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eos.api import Connector
    from eos_connectors.postgres.declare import Sink

    connector: Connector

__all__ = ["Sink", "connector"]


def __getattr__(name: str) -> Any:
    if name == "Sink":
        from eos_connectors.postgres.declare import Sink

        value: Any = Sink
    elif name == "connector":
        from eos.api import Connector
        from eos_connectors.postgres.sink import PostgresSink

        value = Connector("postgres", sink=PostgresSink)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

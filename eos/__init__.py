"""eos: end-to-end exactly-once Kafka pipelines on Apache Spark.

The Python API (docs/PYTHON_API.md):

    import eos
    pipeline = eos.Pipeline("orders", checkpoint="/data/ckpt/orders", spark=spark)
    ...  # pipeline.source(...) -> streaming DataFrame; pipeline.sink(df, ...)
    query = pipeline.start()     # an eos.EosQuery

Importing eos never starts Spark, a JVM or a Kafka client, and loads no configuration models:
Spark starts a fresh Python process per scan at every query start, and those import eos too. The
names below load on first use.
"""

# ruff: noqa: F401  (the imports under TYPE_CHECKING are re-exports, loaded on first use)

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from eos.config import CoordinatorConfig as Coordinator
    from eos.config import EpochConfig as Epochs
    from eos.config import LedgerConfig as Ledger
    from eos.config import MetricsConfig as Metrics
    from eos.errors import ConfigError, EosError
    from eos.pipeline import Pipeline
    from eos.protocol.source import WatermarkConfig as Watermark
    from eos.query import EosQuery

_WHERE = {
    "Pipeline": ("eos.pipeline", "Pipeline"),
    "EosQuery": ("eos.query", "EosQuery"),
    "Epochs": ("eos.config", "EpochConfig"),
    "Ledger": ("eos.config", "LedgerConfig"),
    "Coordinator": ("eos.config", "CoordinatorConfig"),
    "Metrics": ("eos.config", "MetricsConfig"),
    "Watermark": ("eos.protocol.source", "WatermarkConfig"),
    "EosError": ("eos.errors", "EosError"),
    "ConfigError": ("eos.errors", "ConfigError"),
}
__all__ = ["__version__", *sorted(_WHERE)]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'eos' has no attribute {name!r}")
    module, attribute = _WHERE[name]
    value = getattr(import_module(module), attribute)
    globals()[name] = value
    return value

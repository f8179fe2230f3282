"""The source API: a re-settable source, the first step of the epoch protocol (prepare).

For epoch N the source plans, on the driver, exactly which records the epoch covers (Kafka: an
end offset per partition, never beyond what is committed upstream), and Spark logs that plan
in its offset log *before any record is read*: that log entry is the epoch's barrier. A replay
of N reads exactly the logged ranges, so it sees the same records.

The rows a source hands to the pipeline follow one contract: the view's columns, plus
`_eos_error` (why a record could not be decoded, or null) and the record's raw bytes
(`_eos_raw_key`, `_eos_raw_value`, set only where `_eos_error` is) so that a poison record can
be failed on, skipped, or written to a dead-letter queue in the epoch's transactions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from eos.model import Duration, Model
from eos.protocol.barrier import SharedEnds
from eos.protocol.decision import ControlLog
from eos.protocol.sink import PipelineInfo, SinkConnector, pinned_identity

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ERROR = "_eos_error"
RAW_KEY = "_eos_raw_key"
RAW_VALUE = "_eos_raw_value"
POISON_COLUMNS = (ERROR, RAW_KEY, RAW_VALUE)


class WatermarkConfig(Model):
    column: str
    delay: Duration


class SourceEntry(Model):
    """The part of a source's entry in the pipeline file that every kind of source has."""

    name: str
    watermark: WatermarkConfig | None = None
    on_error: Literal["fail", "skip", "dlq"] = "fail"


@dataclass(frozen=True)
class StreamOptions:
    """What the core tells a source when it builds the stream."""

    parallelism: int  # read tasks per epoch (= sink slots of a stateless pipeline)
    failpoints: list[str] = field(default_factory=list)  # armed `source.*` specs (tests)
    failpoint_state: str = ""
    driver_pgid: int = 0
    barriers: str = ""  # a folder on the driver's machine where scans agree on ends (eos.protocol.barrier)
    run: str = ""

    def shared_ends(self, source: str) -> SharedEnds | None:
        """Where every scan of `source` takes each epoch's ends from: a source scanned more than
        once in the query (always: its poison scan) must plan through it."""
        return SharedEnds(str(Path(self.barriers) / source), self.run) if self.barriers else None


@dataclass(frozen=True)
class PartitionLag:
    source: str
    topic: str
    partition: int
    end: int  # the newest readable offset
    committed: int | None  # end offset of the last committed epoch
    # When the oldest record not yet committed was written (Unix seconds: Kafka's record
    # timestamp), if the partition lags and the source can tell.
    oldest: float | None = None

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.committed or 0))


class SourceConnector(ABC):
    kind: ClassVar[str]
    entry_model: ClassVar[type[SourceEntry]]
    # As a sink's (SinkConnector.reach_settings): how to reach the system, left out of the replay
    # identity; what is read and how it decodes stays in it.
    reach_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, entry: SourceEntry, pipeline: PipelineInfo):
        self.entry = entry
        self.pipeline = pipeline

    @property
    def name(self) -> str:
        return self.entry.name

    @abstractmethod
    def describe(self) -> str: ...

    def replay_identity(self) -> dict[str, Any]:
        """What decides which records a replay reads and how they decode (pinned while pending)."""
        return pinned_identity(self.entry, self.kind, self.reach_settings)

    def validate(self) -> None:  # noqa: B027 - optional
        """Offline checks for `eos validate` (schema files exist and parse); no network."""

    @abstractmethod
    def check(self, spark: Any) -> None:
        """Up-front checks with clear errors (topics exist, the system is new enough)."""

    @abstractmethod
    def pin(self) -> dict[str, Any]:
        """At a checkpoint's first start: what must stay fixed for its life (resolved starting
        positions, the identity of what is read). JSON-able; stored in the checkpoint."""

    @abstractmethod
    def check_pin(self, pinned: dict[str, Any]) -> None:
        """At every start: refuse if what is read is no longer what was pinned (a topic deleted
        and recreated under the same name), with a clear error and the way out."""

    @abstractmethod
    def stream(self, spark: Any, pinned: dict[str, Any], options: StreamOptions) -> DataFrame:
        """The streaming DataFrame of this source (see the module doc for its columns)."""

    def poison_stream(self, spark: Any, pinned: dict[str, Any], options: StreamOptions) -> DataFrame:
        """A second scan of the same input, where the pipeline takes the poison rows from.

        Spark gives every scan in a query its own entry in the offset log and refuses a restart
        whose query has a different number of them. The pipeline therefore builds this scan in
        every `on_error` mode, so that switching `on_error` (the way out of a poison stop) keeps
        the checkpoint's shape. Under `fail` no poison row is ever routed, and a source should make
        this scan read nothing; the default reads the input a second time."""
        return self.stream(spark, pinned, options)

    def dead_letters(self) -> SinkConnector | None:
        """The sink of this source's poison records under `on_error: dlq`."""
        return None

    @abstractmethod
    def control_log(self) -> ControlLog:
        """Where the driver fences other drivers and records commit decisions (the first
        source's system: every pipeline has one)."""

    def owns(self, line: dict[str, Any]) -> bool:
        """Whether an offset-log line (or a progress report's end offsets) is this source's.
        Spark logs a line per scan of the query, in an order its plan decides: a source scanned
        twice (its poison scan, or SQL that reads its view twice) has several."""
        return True

    def lag(self, logged: dict[str, Any] | None) -> list[PartitionLag]:
        """Lag behind the newest input, given the source's line of the last committed epoch."""
        return []

    def publish_progress(self, logged: dict[str, Any]) -> None:  # noqa: B027 - optional
        """Make the last committed position visible to external monitors (never read back)."""

    def close(self) -> None:  # noqa: B027 - optional
        pass

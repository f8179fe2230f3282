"""A pipeline in code: Kafka sources as streaming DataFrames, any PySpark code in between,
two-phase-commit sinks, one streaming query that commits every epoch exactly once.

    import eos
    from eos_connectors import kafka, postgres

    pipeline = eos.Pipeline("orders", checkpoint="/data/ckpt/orders", spark=spark,
                            epochs=eos.Epochs(trigger="1s", output_mode="update"))
    orders = pipeline.source(kafka.source("orders", bootstrap=BROKERS, topics=["orders"],
                                          value_format=kafka.json("id STRING, country STRING, amount DOUBLE")))
    totals = orders.groupBy("country").agg(F.sum("amount").alias("total"))
    pipeline.sink(totals, kafka.sink("totals", bootstrap=BROKERS, topic="totals", key="country"))
    pipeline.sink(totals, postgres.sink("totals_pg", dsn=DSN, table="totals", mode="upsert", key=["country"]))
    query = pipeline.start()            # an eos.EosQuery: awaitTermination(), stop(), lastProgress, status

A pipeline file is a front end to this class (eos.yamlpipeline): it declares the same sources and
sinks, and its transforms are SQL views and Python functions over them. Both take one path from
here on: the same checks, the same recovery, the same protocol.

Every sink's rows are a branch of one union, each in a struct column of its own, tagged with the
sink's index (eos.protocol.plan), dead-letter rows included. One streaming query and one
checkpoint: every epoch's output, over all sinks, is decided and committed as one unit. (Readers
may still see part of an epoch while its commit phase runs, or while a crashed driver is down:
commits are per sink and slot. See docs/EXACTLY_ONCE.md.)
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos import registry
from eos.analysis import spark_message
from eos.config import (
    CoordinatorConfig,
    EpochConfig,
    LedgerConfig,
    MetricsConfig,
    PipelineConfig,
    PipelineHeader,
    SparkConfig,
    kind_of,
    pipeline_model,
)
from eos.declared import Connectors, connectors, load_function, pipeline_info, replay_config
from eos.errors import ConfigError, EosError
from eos.failpoints import SOURCE_POINTS, Failpoints, from_specs
from eos.model import masked_text
from eos.protocol.checkpoint import Checkpoint
from eos.protocol.plan import SINK_TAG, SinkPlan, sink_column
from eos.protocol.report import EpochListener
from eos.protocol.sink import Recovery, SinkConnector, SinkEntry
from eos.protocol.source import ERROR, POISON_COLUMNS, SourceConnector, SourceEntry, StreamOptions
from eos.startup import OpenedCheckpoint, check_source_pin, check_spark, open_checkpoint, pinned_parallelism

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eos.query import EosQuery


@dataclass
class _Branch:
    """One branch of the union: a sink's rows, or a source's poison rows."""

    name: str
    rows: Any
    sink: SinkConnector | None  # None: rows are only counted (poison under `fail` or `skip`)


class Pipeline:
    """An exactly-once pipeline built in code (see the module doc).

    `spark`: your SparkSession. eos runs the pipeline in a new session of it (`pipeline.spark`:
    the same SparkContext, its own SQL settings and temporary views), so the settings the protocol
    needs never change your session. The DataFrames `source()` returns live in that session.
    Without one, eos builds its own (`master`, `spark_conf`: as a pipeline file's `spark:`).
    `base_dir`: where relative paths (schema files, a relative checkpoint) are resolved; default
    the working directory. `failpoints`: failure injection for tests (eos/failpoints.py)."""

    def __init__(
        self,
        name: str,
        checkpoint: str | os.PathLike[str],
        *,
        spark: SparkSession | None = None,
        epochs: EpochConfig | Mapping[str, Any] | None = None,
        ledger: LedgerConfig | Mapping[str, Any] | None = None,
        coordinator: CoordinatorConfig | Mapping[str, Any] | None = None,
        metrics: MetricsConfig | Mapping[str, Any] | None = None,
        master: str | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        failpoints: Sequence[str] = (),
    ):
        header = _validated_header(
            name=name,
            checkpoint=str(checkpoint),
            epochs=epochs if epochs is not None else EpochConfig(),
            ledger=ledger if ledger is not None else LedgerConfig(),
            coordinator=coordinator if coordinator is not None else CoordinatorConfig(),
            metrics=metrics if metrics is not None else MetricsConfig(),
            spark=SparkConfig(master=master, conf=dict(spark_conf or {})),
        )
        self._init(header, Path(base_dir) if base_dir is not None else Path.cwd(), spark, list(failpoints))

    @classmethod
    def from_header(
        cls,
        header: PipelineHeader,
        base_dir: Path | None,
        spark: Any = None,
        failpoints: Sequence[str] = (),
        parallelism: int | None = None,
    ) -> Pipeline:
        """For front ends that validated the header themselves (a pipeline file). `parallelism`:
        slots per epoch when `slots` is unset, instead of what the checkpoint pins now (a standby
        builds with the running driver's: eos.standby)."""
        pipeline = cls.__new__(cls)
        pipeline._init(header, base_dir, spark, list(failpoints), parallelism)
        return pipeline

    def _init(
        self, header: PipelineHeader, base_dir: Path | None, spark: Any, failpoints: list[str],
        parallelism: int | None = None,
    ) -> None:  # fmt: skip
        self.header = header
        self.base_dir = base_dir
        self.location = header.checkpoint_path(base_dir)
        self._state = "building"
        self._sources: list[SourceConnector] = []
        self._pins: dict[str, dict[str, Any]] = {}
        self._source_entries: list[SourceEntry] = []
        self._sink_entries: list[SinkEntry] = []
        self._branches: list[_Branch] = []
        self._poison: list[_Branch] = []
        self._inputs: dict[str, str] = {}
        self._checked: dict[int, Any] = {}  # id(entry) -> its checked connector
        self._systems_checked = False  # a front end's pre-flight checked every system a moment ago
        self.transforms: list[Any] = []  # a pipeline file's transforms (eos.yamlpipeline), for the replay config
        self._union: tuple[Any, tuple[SinkPlan, ...]] | None = None
        if spark is not None:
            # A SIGTERM or Ctrl-C that reaches your JVM stops the pipeline's query first, at an
            # epoch's end, before Spark stops its context (eos.jvmstop; eos's own sessions have it).
            from eos import jvmstop

            jvmstop.stop_eos_first(spark)
            self.spark = spark.newSession()
        else:
            from eos.sparksession import build_spark

            conf = {k: str(v) for k, v in header.spark.conf.items()}
            self.spark = build_spark(
                f"eos-{header.name}", master=header.spark.master, conf=conf, checkpoint=self.location
            )
        check_spark(self.spark)
        self.checkpoint = Checkpoint(self.location, self.spark)
        self.opened: OpenedCheckpoint = open_checkpoint(self.checkpoint, header.name, header.epochs.mode)
        self.info = pipeline_info(header, self.opened.checkpoint_id, base_dir)
        self.failpoints: Failpoints = from_specs(failpoints, str(self.checkpoint.scratch_dir() / "failpoints"))
        self.parallelism = (
            pinned_parallelism(self.opened, header.epochs.slots, self.spark.sparkContext.defaultParallelism)
            if parallelism is None or header.epochs.slots is not None
            else parallelism  # a standby's: the running driver's count (eos.standby)
        )
        if "spark.sql.shuffle.partitions" not in header.spark.conf:
            # Slots are the partitions of the epoch's rows: a stateless pipeline's come from the
            # source's read tasks, a stateful one's from its shuffle; `slots` means both.
            # (Spark keeps a stateful checkpoint's own number once it has one.)
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))
        # With exchange reuse on, Spark (4.x) plans the second of two branches that share a
        # stateful subplan (two sinks of one windowed aggregate, append mode) onto the first one's
        # shuffle, and that branch then emits nothing: its sink silently misses every row. Each
        # branch must run its own plan.
        self.spark.conf.set("spark.sql.exchange.reuse", "false")
        self.run_id = uuid.uuid4().hex[:12]
        self.stream_options = StreamOptions(
            parallelism=self.parallelism,
            failpoints=[p.spec() for p in self.failpoints.points if p.name in SOURCE_POINTS],
            failpoint_state=self.failpoints.state_dir,
            driver_pgid=self.failpoints.driver_pgid,
            barriers=str(self.checkpoint.scratch_dir() / "barriers"),
            run=self.run_id,
        )

    # -- declaring ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.header.name

    def _building(self, what: str) -> None:
        if self._state != "building":
            raise ConfigError(f"pipeline {self.name}: {what} after start(); declare every source and sink first")

    def source(self, entry: SourceEntry) -> DataFrame:
        """Declare a source; returns its records as a streaming DataFrame (decoded, watermarked).
        Records it cannot decode never appear here: they follow the source's `on_error`."""
        from pyspark.sql import functions as F

        self._building("a source was declared")
        if entry.name in {s.name for s in self._sources}:
            raise ConfigError(f"two sources are named {entry.name!r}")
        connector = self.check(entry)
        self._pins[entry.name] = check_source_pin(self.opened, connector)
        rows = connector.stream(self.spark, self._pins[entry.name], self.stream_options)
        view = rows.filter(F.col(ERROR).isNull()).drop(*POISON_COLUMNS)
        watermark = entry.watermark
        if watermark is not None:
            if watermark.column not in view.columns:
                raise ConfigError(
                    f"source {entry.name}: watermark column {watermark.column!r} is not one of "
                    f"{', '.join(view.columns)}"
                )
            view = view.withWatermark(watermark.column, f"{int(watermark.delay * 1000)} milliseconds")
        # Poison rows come from a second scan of the same epoch's input (Spark's offset log has an
        # entry per scan, so it exists in every on_error mode: switching modes keeps the
        # checkpoint's shape). Under `fail` it reads nothing: the read task stops at the first.
        poison = connector.poison_stream(self.spark, self._pins[entry.name], self.stream_options)
        poison = poison.filter(F.col(ERROR).isNotNull())
        if entry.on_error in ("fail", "skip"):
            label = "poison" if entry.on_error == "fail" else "skipped"
            self._poison.append(_Branch(f"{entry.name}.{label}", poison.select(F.lit(1).alias("n")), None))
        else:
            dead = connector.dead_letters()
            if dead is None:
                raise ConfigError(f"source {entry.name}: on_error {entry.on_error!r} needs a dead-letter queue")
            dead.validate()
            if not self._systems_checked:
                dead.check(self.spark)
            self._poison.append(_Branch(dead.name, dead.rows(poison), dead))
        self._sources.append(connector)
        self._source_entries.append(entry)
        return view

    def sink(self, rows: DataFrame, entry: SinkEntry) -> None:
        """Declare a sink: every epoch, `rows` (a streaming DataFrame derived from the sources)
        are written to it in a transaction, committed together with every other sink's."""
        self._building("a sink was declared")
        if entry.name in {e.name for e in self._sink_entries}:
            raise ConfigError(f"two sinks are named {entry.name!r}")
        if not getattr(rows, "isStreaming", False):
            raise ConfigError(
                f"sink {entry.name}: its rows must be a streaming DataFrame derived from the pipeline's sources"
            )
        connector = self.check(entry)
        try:
            sink_rows = connector.rows(rows)
        except EosError:
            raise
        except Exception as exc:
            raise ConfigError(f"sink {entry.name!r}: {spark_message(exc)}") from exc
        self._branches.append(_Branch(entry.name, sink_rows, connector))
        self._sink_entries.append(entry)
        self._inputs[entry.name] = rows.schema.simpleString()

    def check(self, entry: SourceEntry | SinkEntry, systems: bool = True) -> Any:
        """Check a source or sink before it is declared (its files, its system: topics exist,
        settings the protocol needs); returns its connector. `source()` and `sink()` check what
        was not checked yet: a front end checks every entry first, so that what is wrong with the
        systems is reported before what is wrong with the transforms."""
        checked = self._checked.get(id(entry))
        if checked is not None and checked.entry is entry:
            return checked
        sources, sinks = registry.source_kinds(), registry.sink_kinds()
        if isinstance(entry, SourceEntry):
            connector: Any = sources[_kind(entry, sources, "source")](entry, self.info)
        else:
            connector = sinks[_kind(entry, sinks, "sink")](entry, self.info)
        connector.validate()
        if systems:  # a front end that ran the pre-flight (eos.preflight) a moment ago skips this
            connector.check(self.spark)
        else:
            self._systems_checked = True
        self._checked[id(entry)] = connector
        return connector

    # -- the config this declares --------------------------------------------------------------
    def config(self) -> PipelineConfig:
        """The whole pipeline as the typed config a pipeline file would give."""
        data = self.header.model_dump(by_alias=True, include=set(PipelineHeader.model_fields))
        data.update(sources=list(self._source_entries), sinks=list(self._sink_entries), transforms=self.transforms)
        config = pipeline_model().model_validate(data)
        config._loaded = self.header.loaded
        return config

    def connectors(self) -> Connectors:
        sinks = [b.sink for b in self._branches if b.sink is not None]
        dead = [b.sink for b in self._poison if b.sink is not None]
        return Connectors(list(self._sources), [*sinks, *dead])

    # -- running -------------------------------------------------------------------------------
    def start(
        self,
        trigger: str | None = None,
        *,
        take_over: bool = False,
        finish_pending: bool = False,
        progress: bool = False,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        listeners: Iterable[EpochListener] = (),
        standby: bool = False,
        stop: threading.Event | None = None,
    ) -> EosQuery | None:
        """Recover (fence, resolve, read the ledgers), then start the streaming query; returns its
        handle. `take_over`: fence a previous driver that still answers instead of refusing to
        start. `finish_pending`: replay only the pending epoch (a handle that ends after it; an
        already finished handle when nothing is pending). `standby`: first stand by, warm, until
        the pipeline's running driver is gone, then take it over (eos.standby); `stop`, an Event
        that ends the standing by early (start then returns None)."""
        from eos.launch import StartOptions, launch

        self._building("start() was called again")
        if not self._sources:
            raise ConfigError(f"pipeline {self.name} has no source")
        if not self._branches:
            raise ConfigError(f"pipeline {self.name} has no sink")
        self._state = "starting"
        options = StartOptions(
            trigger, take_over, finish_pending, progress, metrics_port, metrics_host, list(listeners), stop
        )
        try:
            if standby:
                from eos.standby import stand_by

                return stand_by(self, options)
            return launch(self, options)
        except BaseException:
            self._state = "failed"
            raise

    def union(self) -> tuple[Any, tuple[SinkPlan, ...]]:
        """The epoch's rows: every branch's rows in a struct column of their own, tagged with its
        index (in the union's order: the configured sinks, then each source's poison rows). Built
        once (a standby builds it while it waits: eos.standby)."""
        if self._union is None:
            self._union = self._build_union()
        return self._union

    def _build_union(self) -> tuple[Any, tuple[SinkPlan, ...]]:
        from pyspark.sql import functions as F

        tagged, plans = [], []
        for index, branch in enumerate(self._branches + self._poison):
            rows = branch.rows
            tagged.append(rows.select(F.lit(index).alias(SINK_TAG), F.struct(*rows.columns).alias(sink_column(index))))
            by_owner = branch.sink is not None and type(branch.sink).recovery is Recovery.REPLAY
            plans.append(
                SinkPlan(branch.name, index, branch.sink.writer() if branch.sink is not None else None, by_owner)
            )
        stream = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
        return stream, tuple(plans)

    @property
    def pins(self) -> dict[str, dict[str, Any]]:
        return dict(self._pins)

    @property
    def inputs(self) -> dict[str, str]:
        """The schema of each sink's rows, by sink (the replay identity of code-built transforms)."""
        return dict(self._inputs) if not self.transforms else {}

    def driver_identity(self, coordinator: Any) -> Any:
        """What the control log records of this driver: how to ask it whether it still runs."""
        from eos.protocol.decision import DriverInfo

        return DriverInfo(
            self.run_id, socket.gethostname(), os.getpid(), coordinator.address.hostport, pipeline=self.name,
            ping_key=coordinator.ping_key, checkpoint_id=self.opened.checkpoint_id,
            checkpoint=masked_text(self.checkpoint.uri),
        )  # fmt: skip

    def close(self) -> None:
        for connector in [*self._sources, *(b.sink for b in self._branches + self._poison if b.sink)]:
            connector.close()


def _validated_header(**fields: Any) -> PipelineHeader:
    from pydantic import ValidationError

    try:
        return PipelineHeader.model_validate(fields)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("eos.Pipeline: " + "; ".join(problems)) from None


def _kind(entry: Any, kinds: Mapping[str, Any], what: str) -> str:
    kind = kind_of(entry)
    if kind is None or kind not in kinds:
        known = ", ".join(sorted(kinds)) or "none installed"
        raise ConfigError(f"{what} {getattr(entry, 'name', entry)!r} is not a {what} of a known kind ({known})")
    return kind


__all__ = ["Connectors", "Pipeline", "connectors", "load_function", "pipeline_info", "replay_config"]

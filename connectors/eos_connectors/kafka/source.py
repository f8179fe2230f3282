"""The Kafka source connector: checks, pins and builds the re-settable source (eos_connectors.kafka.reader)
for one `sources:` entry, and its dead-letter queue.

Pinned at a checkpoint's first start: each topic's starting offsets, resolved once from
`earliest`/`latest`/explicit offsets (so `initialOffset` is stable across restarts), and each
topic's id. At every start and in every epoch's plan the ids are compared: a topic deleted and
recreated under the same name is refused with a clear error, whatever its offsets look like.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from eos.api import (
    ERROR,
    RAW_KEY,
    RAW_VALUE,
    CheckpointError,
    ConfigError,
    ControlLog,
    EnvironmentProblem,
    PartitionLag,
    PipelineInfo,
    SinkConnector,
    SourceConnector,
    StreamOptions,
)
from eos_connectors.formats import avro, check_formats
from eos_connectors.formats.decode import decode_in_spark, source_view
from eos_connectors.kafka import access
from eos_connectors.kafka import offsets as planning
from eos_connectors.kafka.clients import (
    NotAuthorized,
    UnknownTopic,
    admin_client,
    consumer,
    describe_topics,
    end_offsets,
    missing_topic,
    reachable,
    start_offsets,
)
from eos_connectors.kafka.config import KafkaSinkEntry, KafkaSinkSection, KafkaSourceEntry
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.group_offsets import commit_group
from eos_connectors.kafka.oldest import oldest_timestamps, peek_consumer
from eos_connectors.kafka.reader import FORMAT_NAME, KafkaDataSource, ReaderOptions
from eos_connectors.kafka.sink import KafkaSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class KafkaSource(SourceConnector):
    kind = "kafka"
    entry_model = KafkaSourceEntry
    reach_settings = ("config", "bootstrap")  # credentials and client tuning; the topics stay pinned
    entry: KafkaSourceEntry

    def __init__(self, entry: KafkaSourceEntry, pipeline: PipelineInfo):
        super().__init__(entry, pipeline)
        self._admin: Any = None
        self._peek: Any = None  # the lag monitor's consumer of the oldest records' timestamps

    @property
    def client(self) -> dict[str, Any]:
        return self.entry.kafka.client()

    @property
    def group_id(self) -> str:
        """The consumer group its progress is committed to, for lag monitors only."""
        return f"eos-{self.pipeline.name}.{self.name}"

    @property
    def admin(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.client)
        return self._admin

    def describe(self) -> str:
        kafka = self.entry.kafka
        start = kafka.starting_offsets if isinstance(kafka.starting_offsets, str) else "explicit"
        return (
            f"{', '.join(kafka.topics)} @ {kafka.bootstrap} ({self.entry.value_format.type}, {kafka.isolation}, "
            f"start {start}, on_error {self.entry.on_error})"
        )

    def replay_identity(self) -> dict[str, Any]:
        identity = super().replay_identity()
        # How the read tasks cut the logged ranges decides which slot writes which records: an
        # epoch planned by an eos that cut them otherwise must be finished by that eos.
        identity["read_tasks"] = planning.READ_TASKS
        return identity

    # -- checks and pins -----------------------------------------------------------------------
    def validate(self) -> None:
        formats = {"key_format": self.entry.key_format, "value_format": self.entry.value_format}
        check_formats(f"source {self.name}", formats, self.pipeline.base_dir)

    def _topics(self) -> dict[str, Any]:
        kafka = self.entry.kafka
        try:
            topics = reachable(
                f"source {self.name}", kafka.bootstrap, lambda: describe_topics(self.admin, kafka.topics)
            )
        except UnknownTopic as exc:
            raise missing_topic(
                f"source {self.name}", exc.topic, kafka.bootstrap, self.admin, hint="create it, or fix `topics:`"
            ) from None
        except NotAuthorized:
            access.check_source(self)  # names the missing ACLs
            raise
        for topic, info in topics.items():
            if not info.topic_id or info.topic_id.startswith("AAAAAAAAAAAAAAAAAAAAAA"):
                raise EnvironmentProblem(
                    f"source {self.name}: the brokers at {kafka.bootstrap} report no id for topic {topic!r}: they are "
                    "older than Kafka 2.8, and eos relies on topic ids to tell a recreated topic from the original",
                    hint="upgrade the brokers to Kafka 3.0 or later",
                )
        return topics

    def check(self, spark: Any) -> None:
        # Its dead-letter queue is a sink of the pipeline: checked with the sinks (eos.pipeline.connectors).
        access.check_source(self)  # the ACLs it needs, before anything is written
        self._topics()

    def pin(self) -> dict[str, Any]:
        topics = self._topics()
        kafka = self.entry.kafka
        partitions = {topic: info.partitions for topic, info in topics.items()}
        starting = kafka.starting_offsets
        if starting == "earliest":
            resolved = start_offsets(self.admin, partitions)
        elif starting == "latest":
            resolved = end_offsets(self.admin, partitions, read_committed=kafka.isolation == "read_committed")
        else:
            resolved = {}
            for topic, parts in partitions.items():
                given = starting.get(topic)
                if given is None:
                    raise ConfigError(f"source {self.name}: starting_offsets names no offsets for topic {topic!r}")
                for partition in parts:
                    if partition not in given:
                        raise ConfigError(
                            f"source {self.name}: starting_offsets for {topic!r} has no offset for partition "
                            f"{partition}"
                        )
                    resolved[(topic, partition)] = int(given[partition])
        return {
            "topics": list(kafka.topics),
            "starting": planning.encode(resolved),
            "topic_ids": {topic: info.topic_id for topic, info in topics.items()},
        }

    def check_pin(self, pinned: dict[str, Any]) -> None:
        if sorted(pinned["topics"]) != sorted(self.entry.kafka.topics):
            raise CheckpointError(
                f"source {self.name}: topics changed from {pinned['topics']} to {list(self.entry.kafka.topics)}; Spark "
                "cannot resume a checkpoint whose sources read other topics",
                hint="use a new checkpoint location (the output is then written from the new starting offsets)",
            )
        for topic, info in self._topics().items():
            was = pinned.get("topic_ids", {}).get(topic)
            if was and was != info.topic_id:
                raise CheckpointError(
                    f"source {self.name}: topic {topic!r} is not the topic this checkpoint read: it was deleted and "
                    f"recreated (topic id {was} then, {info.topic_id} now). Its offsets now mean other records; "
                    "resuming would skip or re-read some of them.",
                    hint="to start over on the new topic: `eos reset PIPELINE --yes` (its output is written again)",
                )

    # -- the stream ----------------------------------------------------------------------------
    def _codec(self, which: str) -> Any:
        fmt = self.entry.key_format if which == "key" else self.entry.value_format
        if fmt.type != "avro":
            return None
        return avro.decode_codec(fmt, which, self.pipeline.base_dir, list(self.entry.kafka.topics))

    def stream(self, spark: Any, pinned: dict[str, Any], options: StreamOptions) -> DataFrame:
        return self._scan(spark, pinned, options, poison_scan=False)

    def owns(self, line: dict[str, Any]) -> bool:
        return bool(line) and set(line) <= set(self.entry.kafka.topics)

    def poison_stream(self, spark: Any, pinned: dict[str, Any], options: StreamOptions) -> DataFrame:
        return self._scan(spark, pinned, options, poison_scan=True)

    def _scan(self, spark: Any, pinned: dict[str, Any], options: StreamOptions, poison_scan: bool) -> DataFrame:
        kafka = self.entry.kafka
        reader = ReaderOptions(
            name=self.name,
            client=self.client,
            topics=list(kafka.topics),
            starting=pinned["starting"],
            topic_ids=pinned.get("topic_ids", {}),
            parallelism=options.parallelism,
            on_error=self.entry.on_error,
            key_codec=self._codec("key"),
            value_codec=self._codec("value"),
            max_records_per_epoch=kafka.max_records_per_epoch,
            max_records_per_task=kafka.max_records_per_task,
            read_committed=kafka.isolation == "read_committed",
            on_out_of_range=kafka.on_out_of_range,
            group_id=self.group_id,
            failpoints=options.failpoints,
            failpoint_state=options.failpoint_state,
            driver_pgid=options.driver_pgid,
            poison_scan=poison_scan,
            shared_ends=options.shared_ends(self.name),
        )
        _register(spark)
        raw = spark.readStream.format(FORMAT_NAME).option("eos.source", reader.encode()).load()
        if poison_scan and self.entry.on_error == "fail":
            # This scan reads nothing under `fail` (the reader plans no task for it), and the
            # pipeline only filters it on the poison column: no decoding and no view to build
            # and plan (~40 ms of every start, and a smaller plan for every epoch).
            return raw
        decoded = decode_in_spark(raw, self.entry, self.pipeline.base_dir)
        return source_view(decoded, self.entry)

    def dead_letters(self) -> SinkConnector | None:
        if self.entry.on_error != "dlq" or not self.entry.dlq_topic:
            return None
        entry = KafkaSinkEntry.model_construct(
            name=f"{self.name}.dlq",
            input=None,
            kafka=KafkaSinkSection.model_construct(
                bootstrap=self.entry.kafka.bootstrap,
                topic=self.entry.dlq_topic,
                partitions=1,
                create_topic=True,
                # The source's whole client settings: the DLQ is a producer on the source's cluster, and
                # the producer takes every setting that applies to it (clients.settings_for).
                config=dict(self.entry.kafka.config),
            ),
            key="key",
            value="value",
            headers="headers",
            transactional_id_prefix=None,
        )
        return DeadLetters(entry, self.pipeline, self.entry)

    def control_log(self) -> ControlLog:
        return KafkaControlLog(
            self.client, f"{self.pipeline.ledger}.control", self.pipeline.name,
            timeout_s=max(60.0, self.pipeline.epoch_timeout_s),
        )  # fmt: skip

    # -- monitoring ----------------------------------------------------------------------------
    def lag(self, logged: dict[str, Any] | None) -> list[PartitionLag]:
        kafka = self.entry.kafka
        read_committed = kafka.isolation == "read_committed"
        partitions = {topic: info.partitions for topic, info in describe_topics(self.admin, kafka.topics).items()}
        ends = end_offsets(self.admin, partitions, read_committed=read_committed)
        done = planning.decode(logged) if logged else {}
        # How long the lagging partitions' next records have waited (eos_connectors.kafka.oldest).
        behind = {tp: done[tp] for tp, end in ends.items() if tp in done and end > done[tp]}
        if behind and self._peek is None:
            self._peek = peek_consumer(self.client, read_committed)
        oldest = oldest_timestamps(self._peek, behind) if behind else {}
        return [
            PartitionLag(self.name, topic, partition, end, done.get((topic, partition)), oldest.get((topic, partition)))
            for (topic, partition), end in sorted(ends.items())
        ]

    def publish_progress(self, logged: dict[str, Any]) -> None:
        ends = planning.decode(logged)
        if not ends:
            return
        group = consumer(self.client, **{"group.id": self.group_id})
        try:
            commit_group(group, ends)
        finally:
            group.close()

    def close(self) -> None:
        if self._peek is not None:
            self._peek.close()
            self._peek = None


class DeadLetters(KafkaSink):
    """A source's dead-letter queue: each poison record as it was read (raw key and value, its
    headers) plus provenance headers, written exactly once in the epoch's transactions."""

    def __init__(self, entry: KafkaSinkEntry, pipeline: PipelineInfo, source: KafkaSourceEntry):
        super().__init__(entry, pipeline)
        self.source = source

    def rows(self, view: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        meta = "_" if self.source.value_format.type in ("json", "avro") else ""

        def header(name: str, value: Any) -> Any:
            return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

        provenance = F.array(
            header("eos.error", F.col(ERROR)),
            header("eos.pipeline", F.lit(self.pipeline.name)),
            header("eos.source", F.lit(self.source.name)),
            header("eos.topic", F.col(f"{meta}topic")),
            header("eos.partition", F.col(f"{meta}partition")),
            header("eos.offset", F.col(f"{meta}offset")),
        )
        return view.select(
            F.col(RAW_KEY).alias("key"),
            F.col(RAW_VALUE).alias("value"),
            F.concat(F.col(f"{meta}headers"), provenance)
            .cast("array<struct<key: string, value: binary>>")
            .alias("headers"),
        )


_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def _register(spark: Any) -> None:
    """Register the "eos-kafka" format once per session: every scan (the main and the poison scan
    of every source) goes through here, and Spark warns on each re-registration."""
    if spark not in _REGISTERED:
        spark.dataSource.register(KafkaDataSource)
        _REGISTERED.add(spark)

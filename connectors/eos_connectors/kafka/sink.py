"""The two-phase-commit Kafka sink.

Per slot and epoch attempt, in a Spark task: take a transactional id from the sink's pool (the
vote service leases one that this Python worker already holds idle, so its producer is reused:
no `init_transactions`, no new connection), `begin_transaction`, produce the slot's rows, produce
the slot's ledger entry into the ledger topic in the same transaction, flush. That is the
pre-commit. The commit itself (`commit_transaction`) happens on a thread of the same worker after
the driver recorded its decision (eos.protocol.slot): librdkafka cannot commit a transaction
another producer opened, so the producer that pre-committed must be the one that commits, and a
pre-committed transaction whose process dies is lost: recovery fences every id of the pool
(`init_transactions` aborts what was open) and the epoch is replayed for the slots whose ledger
entry does not show it (Recovery.REPLAY).

Producers after an indefinite error. librdkafka speaks the pre-KIP-890 transaction protocol, on
which a delayed produce or EndTxn of one transaction can land in a later transaction of the same
producer (Jepsen's 2024 analysis: lost writes, aborted reads). So after any error whose outcome
is unknown (a timeout on produce, flush, AddPartitions or EndTxn) a producer is never used again:
`_Producer.use` discards it, and the next lease of its id initialises a new one, which bumps the
producer epoch and fences whatever of the old one is still in flight.

In at-least-once mode the sink produces with an idempotent, non-transactional producer and
writes no ledger: the baseline, and the negative control of the fault tests. It may duplicate;
it must never lose: every delivery error fails the task (and Spark retries it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eos.api import (
    ConfigError,
    Decision,
    EnvironmentProblem,
    Ledger,
    LedgerEntry,
    PipelineInfo,
    Pool,
    Prepared,
    Recovery,
    SinkConnector,
    SlotAborted,
    SlotContext,
    SlotWriter,
    WriterFactory,
    redacted,
)
from eos_connectors.formats import avro, check_formats
from eos_connectors.formats.encode import sink_columns
from eos_connectors.kafka import access, ids, ledger
from eos_connectors.kafka.clients import (
    BrokerUnreachable,
    UnknownTopic,
    admin_client,
    broker_setting,
    cluster_id,
    connect,
    create_topic,
    describe_topics,
    is_fenced,
    is_indefinite,
    is_retriable,
    kafka_error,
    missing_topic,
    principal,
    producer,
    reachable,
)
from eos_connectors.kafka.config import KafkaSinkEntry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("eos.sink")

# Batching for the sink's producers (the raw-loop benchmark baseline uses the same): large
# batches, a short linger, lz4. A sink's own `config:` overrides any of them.
PRODUCER_BATCHING: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
    "compression.type": "lz4",
}


def transaction_timeout_s(epoch_timeout_s: float) -> float:
    """A pre-committed transaction must outlive a slow epoch; the broker aborts it after this."""
    return max(60.0, 2 * epoch_timeout_s)


class KafkaSink(SinkConnector):
    kind = "kafka"
    entry_model = KafkaSinkEntry
    recovery = Recovery.REPLAY
    reach_settings = ("config", "bootstrap")  # credentials and client tuning; the topic stays pinned
    entry: KafkaSinkEntry

    def __init__(self, entry: KafkaSinkEntry, pipeline: PipelineInfo, view: str | None = None):
        super().__init__(entry, pipeline)
        self._cluster: str | None = None
        self._writer: KafkaWriterFactory | None = None

    # -- identity ----------------------------------------------------------------------------
    @property
    def client(self) -> dict[str, Any]:
        return self.entry.kafka.client()

    @property
    def prefix(self) -> str:
        return self.entry.transactional_id_prefix or ids.default_prefix(self.pipeline.name)

    def describe(self) -> str:
        return (
            f"{self.entry.kafka.topic} @ {self.entry.kafka.bootstrap} ({self.entry.value_format.type}), "
            f"transactional ids {ids.pool_id(self.prefix, self.name, 0).removesuffix('0')}<n>"
        )

    def system(self) -> str:
        if self._cluster is None:
            self._cluster = f"kafka cluster {cluster_id(admin_client(self.client))}"
        return self._cluster

    # -- checks ------------------------------------------------------------------------------
    def validate(self) -> None:
        formats = {"key_format": self.entry.key_format, "value_format": self.entry.value_format}
        check_formats(f"sink {self.name}", formats, self.pipeline.base_dir)

    def check(self, spark: Any) -> None:
        admin = admin_client(self.client)
        topic = self.entry.kafka.topic
        with ThreadPoolExecutor(max_workers=1) as pool:
            # The brokers' limit on transactions is asked for while the topic is looked up.
            exactly_once = self.pipeline.exactly_once
            limit = pool.submit(broker_setting, admin, "transaction.max.timeout.ms") if exactly_once else None
            access.check_sink(self, admin, limit)  # the ACLs it needs, before anything is written
            try:
                reachable(f"sink {self.name}", self.entry.kafka.bootstrap, lambda: describe_topics(admin, [topic]))
            except UnknownTopic:
                if not self.entry.kafka.create_topic:
                    raise missing_topic(
                        f"sink {self.name}",
                        topic,
                        self.entry.kafka.bootstrap,
                        admin,
                        hint="create it, or set `create_topic: true` (with `partitions: N`) on the sink",
                    ) from None
                create_topic(admin, topic, self.entry.kafka.partitions)
                access.check_created(self.client, access.sink_who(self), topic, admin)
        if limit is not None:  # exactly-once
            self._check_transaction_timeout(access.transaction_limit(self, limit))

    def set_up(self) -> None:
        # A new pipeline's ledger topic takes a topic creation (~50 ms here), beside the build.
        if self.pipeline.exactly_once:
            ledger.ensure_ledger_topic(self.client, self.pipeline.ledger)
            access.check_created(self.client, access.sink_who(self), self.pipeline.ledger)

    def _check_transaction_timeout(self, limit: str | None) -> None:
        wanted = transaction_timeout_s(self.pipeline.epoch_timeout_s)
        override = self.client.get("transaction.timeout.ms")
        wanted_ms = int(override) if override is not None else int(wanted * 1000)
        if limit is not None and wanted_ms > int(limit):
            raise ConfigError(
                f"sink {self.name}: transactions would need transaction.timeout.ms={wanted_ms} (twice epochs.timeout, "
                f"so a pre-committed epoch outlives a slow one), but the brokers at {self.entry.kafka.bootstrap} allow "
                f"at most transaction.max.timeout.ms={limit}",
                hint=f"lower epochs.timeout to {int(limit) / 2000:.0f}s or less, or raise transaction.max.timeout.ms "
                "on the brokers",
            )

    # -- rows and writers ----------------------------------------------------------------------
    def rows(self, view: DataFrame) -> DataFrame:
        return sink_columns(view, self.entry, self.pipeline.base_dir)

    def writer(self) -> KafkaWriterFactory:
        if self._writer is None:
            entry = self.entry
            codecs = {
                which: avro.encode_codec(fmt, which, self.pipeline.base_dir, entry.kafka.topic)
                for which, fmt in (("key", entry.key_format), ("value", entry.value_format))
                if fmt.type == "avro"
            }
            self._writer = KafkaWriterFactory(
                sink=self.name,
                topic=entry.kafka.topic,
                client=self.client,
                prefix=self.prefix,
                ledger_topic=self.pipeline.ledger,
                exactly_once=self.pipeline.exactly_once,
                timeout_s=self.pipeline.epoch_timeout_s,
                codecs=codecs,
            )
        return self._writer

    # -- recovery ------------------------------------------------------------------------------
    def pool_ids(self, size: int) -> list[str]:
        return [ids.pool_id(self.prefix, self.name, n) for n in range(size)]

    def pool(self, size: int) -> Pool:
        return Pool(size, self.kind, self.system(), {"prefix": self.prefix})

    @classmethod
    def fence(cls, sinks: list[SinkConnector], pools: dict[str, Pool], timeout_s: float) -> int:
        """Every id of every pool recorded on this cluster, each pool with the credentials of the sink it
        belongs to: sinks may write as different principals, each allowed only its own transactional
        ids. A pool that its own credentials cannot fence (its sink renamed or removed since, or its
        prefix changed: its ids may still hold open transactions) is fenced with the credentials of the
        first other sink of the cluster the authorizer lets use them; if none may, a clear error names
        the pool and every principal tried."""
        kafka = [sink for sink in sinks if isinstance(sink, KafkaSink)]
        tried: dict[str, list[str]] = {name: [] for name in pools}
        left = {name: cls._candidates(name, kafka) for name in pools}
        todo = {name: [ids.pool_id(p.detail["prefix"], name, n) for n in range(p.size)] for name, p in pools.items()}
        while any(todo.values()):
            work, owner = [], {}
            for name, txids in todo.items():
                if not txids:
                    continue
                if not left[name]:
                    raise cls._unfenceable(name, pools[name], tried[name])
                sink = left[name].pop(0)
                if tried[name]:
                    log.warning("sink %s: %s may not use its transactional ids; trying %s (sink %s)",
                                name, tried[name][-1], principal(sink.client), sink.name)  # fmt: skip
                tried[name].append(f"{principal(sink.client)} (sink {sink.name})")
                work += [(sink.client, txid) for txid in txids]
                owner.update((txid, name) for txid in txids)
            refused = ledger.fence_each(work, timeout_s)
            todo = {name: [] for name in pools}
            for txid, _ in refused:
                todo[owner[txid]].append(txid)
        return sum(pool.size for pool in pools.values())

    @staticmethod
    def _candidates(name: str, sinks: list[KafkaSink]) -> list[KafkaSink]:
        """The pool's own sink first (if still configured), then every other sink with other settings."""
        ordered = sorted(sinks, key=lambda sink: sink.name != name)
        unique: dict[str, KafkaSink] = {}
        for sink in ordered:
            unique.setdefault(json.dumps(sink.client, sort_keys=True, default=str), sink)
        return list(unique.values())

    @staticmethod
    def _unfenceable(name: str, pool: Pool, tried: list[str]) -> EnvironmentProblem:
        prefix = pool.detail["prefix"]
        return EnvironmentProblem(
            f"recovery cannot fence the {pool.size} transactional ids of sink {name} ({prefix}/{name}/0..) on "
            f"{pool.system}: the cluster refused them to every principal tried: {'; '.join(tried)}. Left unfenced, "
            "a transaction they hold open could still commit after the ledger is read, or hold the ledger back.",
            hint=f"allow one of those principals WRITE and DESCRIBE on the transactional ids prefixed {prefix}/{name}/ "
            "(kafka-acls --resource-pattern-type prefixed), or configure that sink again with its own credentials",
        )

    @classmethod
    def read_ledger(cls, sinks: list[SinkConnector]) -> Ledger:
        found: Ledger = {}
        done: set[str] = set()
        for sink in sinks:
            assert isinstance(sink, KafkaSink)
            if sink.pipeline.ledger in done:  # one read per ledger topic (the sinks share one cluster)
                continue
            done.add(sink.pipeline.ledger)
            try:
                found.update(ledger.read_ledger(sink.client, sink.pipeline.ledger, sink.pipeline.name))
            except Exception:
                access.check_ledger_read(sinks)  # for want of an ACL? Then say which
                raise
        names = {sink.name for sink in sinks}
        return {key: entry for key, entry in found.items() if key[0] in names}

    def forget(self) -> None:
        """Tombstones for this pipeline's entries in the ledger topic (of every Kafka sink it has
        or had on this cluster; a second sink finds them forgotten). The topic stays: other
        pipelines may share it (eos_connectors.kafka.ledger says why it is never deleted)."""
        ledger.forget(self.client, self.pipeline.ledger, self.pipeline.name, self.pipeline.epoch_timeout_s)

    def discard(self, prepared: list[Prepared]) -> None:
        """Fence these ids: a handle, or, for an id leased to a task that never voted, its number."""
        txids = [p.handle or ids.pool_id(self.prefix, self.name, p.detail["lease"]) for p in prepared]
        ledger.fence(self.client, txids, self.pipeline.epoch_timeout_s)

    @classmethod
    def resolve(cls, sinks: list[SinkConnector], decision: Decision | None) -> dict[str, int]:
        return {}

    # -- monitoring ------------------------------------------------------------------------------
    def lingering(self) -> list[str]:
        """Partitions of the sink topic and the ledger topic whose last stable offset is below the
        high watermark ("topic/partition: stable S < end H"): an open transaction pins each of
        them (every read_committed reader waits there), whoever's it is. Read-only."""
        topics = [self.entry.kafka.topic]
        if self.pipeline.exactly_once and self.pipeline.ledger:
            topics.append(self.pipeline.ledger)
        return lingering(self.client, topics)


# ---------------------------------------------------------------------------------------------
# Task side: producers kept per Python worker process
# ---------------------------------------------------------------------------------------------


@dataclass
class _Producer:
    """One transactional producer of this process, for one id of a sink's pool."""

    txid: str
    instance: Any
    busy: bool = False  # a transaction is open
    errors: list[str] = field(default_factory=list)  # delivery errors since the last check
    broken: bool = False

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))


# Keyed by the transactional-id prefix (pipeline and checkpoint) as well as the sink: two pipelines
# in one Spark application may both have a sink named `out`, and must never share producers.
_producers: dict[tuple[str, str, int], _Producer] = {}  # (prefix, sink, pool number) -> producer
_plain: dict[tuple[str, str], _Producer] = {}  # at-least-once: (prefix, sink) -> idempotent producer
_lock = threading.Lock()


def _close(entry: _Producer) -> None:
    with contextlib.suppress(Exception):
        entry.instance.close(1)


@dataclass(frozen=True)
class KafkaWriterFactory(WriterFactory):
    sink: str
    topic: str
    client: dict[str, Any]
    prefix: str
    ledger_topic: str
    exactly_once: bool
    timeout_s: float
    codecs: dict[str, Any]

    def open(self, ctx: SlotContext) -> KafkaWriter:
        return KafkaWriter(self, ctx)

    def __repr__(self) -> str:  # the client settings with their secrets masked
        return (
            f"KafkaWriterFactory(sink={self.sink!r}, topic={self.topic!r}, client={redacted(self.client)!r}, "
            f"prefix={self.prefix!r}, exactly_once={self.exactly_once!r})"
        )

    def config(self, txid: str | None, on_delivery: Any) -> dict[str, Any]:
        config = {
            **PRODUCER_BATCHING,
            **self.client,
            # Only failed deliveries call back: no per-record Python call on the hot path.
            "delivery.report.only.error": True,
            "on_delivery": on_delivery,
            # Small requests (InitProducerId, AddPartitions, EndTxn) must not wait on Nagle.
            "socket.nagle.disable": self.client.get("socket.nagle.disable", True),
        }
        if txid is None:
            config["enable.idempotence"] = True
        else:
            config["transactional.id"] = txid
            config.setdefault("transaction.timeout.ms", int(transaction_timeout_s(self.timeout_s) * 1000))
        return config


def _retry(call: Any, timeout_s: float) -> Any:
    """Retry a transactional call on retriable errors until timeout_s."""
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

    return retry(
        retry=retry_if_exception(is_retriable),
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.05, max=2),
        reraise=True,
    )(call)()


class KafkaWriter(SlotWriter):
    def __init__(self, factory: KafkaWriterFactory, ctx: SlotContext):
        self.factory = factory
        self.ctx = ctx
        self.records_written = 0
        self.reused = False
        self.number: int | None = None
        if factory.exactly_once:
            self.entry = self._lease()
            self._use(lambda p: p.begin_transaction())
        else:
            self.entry = self._plain()

    # -- producers ---------------------------------------------------------------------------
    def _lease(self) -> _Producer:
        sink, prefix = self.factory.sink, self.factory.prefix
        with _lock:
            idle = sorted(
                n for (f, s, n), p in _producers.items() if (f, s) == (prefix, sink) and not p.busy and not p.broken
            )
        lease = self.ctx.lease(idle)
        with _lock:
            for n in lease.stale:  # fenced by another worker since: close
                stale = _producers.pop((prefix, sink, n), None)
                if stale is not None:
                    _close(stale)
            entry = _producers.get((prefix, sink, lease.number))
            if entry is not None and not lease.fresh and not entry.broken:
                entry.busy = True
                self.reused = True
                self.number = lease.number
                return entry
            if entry is not None:
                _producers.pop((prefix, sink, lease.number))
                _close(entry)
        txid = ids.pool_id(self.factory.prefix, sink, lease.number)
        entry = _Producer(txid, None, busy=True)
        entry.instance = producer(self.factory.config(txid, entry.on_delivery))

        def connect_and_init() -> None:
            connect(entry.instance, self.factory.topic, self.factory.timeout_s)
            entry.instance.init_transactions(self.factory.timeout_s)

        try:
            _retry(connect_and_init, self.factory.timeout_s)
        except Exception as exc:
            _close(entry)
            raise SlotAborted(f"sink {sink}: init_transactions({txid}) failed: {kafka_error(exc) or exc}") from None
        with _lock:
            _producers[(prefix, sink, lease.number)] = entry
        self.number = lease.number
        return entry

    def _plain(self) -> _Producer:
        key = (self.factory.prefix, self.factory.sink)
        with _lock:
            entry = _plain.get(key)
            if entry is not None and not entry.broken:
                return entry
            entry = _Producer("", None)
            entry.instance = producer(self.factory.config(None, entry.on_delivery))
            _plain[key] = entry
        # An idempotent producer asks for its producer id at creation; with no broker connected
        # yet it retries on librdkafka's 500 ms timer, and the slot's first flush waits for it.
        # Outside the lock (network I/O) and best effort: an unreachable broker fails the slot
        # where it did before, in the flush.
        with contextlib.suppress(Exception):
            connect(entry.instance, self.factory.topic, self.factory.timeout_s)
        return entry

    def _use(self, call: Any, what: str = "") -> Any:
        """Every call on the producer goes through here: an indefinite error discards it."""
        try:
            return call(self.entry.instance)
        except Exception as exc:
            self._break_if_indefinite(exc)
            raise SlotAborted(
                f"sink {self.factory.sink} slot {self.ctx.slot}: {what or 'producer call'} failed: "
                f"{kafka_error(exc) or exc}"
            ) from None

    def _break_if_indefinite(self, exc: BaseException | None, indefinite: bool = False) -> None:
        """Mark the producer never to be used again after an error whose outcome is unknown (or
        that left it unusable); `_release` then closes it."""
        if indefinite or (exc is not None and (is_indefinite(exc) or is_fenced(exc))):
            self.entry.broken = True

    # -- SlotWriter ----------------------------------------------------------------------------
    def write(self, batch: Any) -> None:
        import pyarrow as pa

        columns = {name: batch.column(name) for name in batch.schema.names}
        for which, codec in self.factory.codecs.items():
            columns[which] = avro.encode_batch(codec, columns[which])
        rows = pa.RecordBatch.from_pydict(columns)
        produce_rows(self.entry.instance, self.factory.topic, rows)
        self.records_written += batch.num_rows
        self._check_deliveries()

    def precommit(self, entry: LedgerEntry) -> Prepared:
        if self.factory.exactly_once:
            key = ledger.entry_key(entry.pipeline, entry.sink, entry.slot)
            self._use(lambda p: p.produce(self.factory.ledger_topic, entry.to_json().encode(), key), "ledger record")
        remaining = self._use(lambda p: p.flush(self.factory.timeout_s), "flush")
        if remaining:
            self._break_if_indefinite(None, indefinite=True)
            raise SlotAborted(
                f"sink {self.factory.sink} slot {self.ctx.slot}: {remaining} records still undelivered after "
                f"{self.factory.timeout_s:.0f} s"
            )
        self._check_deliveries()
        return Prepared(
            self.factory.sink, self.ctx.slot, self.entry.txid, self.records_written, self.ctx.task_attempt,
            {"lease": self.number},
        )  # fmt: skip

    def _check_deliveries(self) -> None:
        if self.entry.errors:
            errors, self.entry.errors = self.entry.errors, []
            # A record the broker did not take is lost to this transaction; its outcome may even
            # be unknown (a timeout): the transaction cannot commit, the producer is not reused.
            self._break_if_indefinite(None, indefinite=True)
            raise SlotAborted(
                f"sink {self.factory.sink} slot {self.ctx.slot}: {len(errors)} records were not delivered to "
                f"{self.factory.topic}: {errors[0]}"
            )

    def commit(self) -> None:
        try:
            _retry(lambda: self.entry.instance.commit_transaction(self.factory.timeout_s), self.factory.timeout_s)
        except Exception as exc:
            self._break_if_indefinite(exc)
            with contextlib.suppress(Exception):
                if not self.entry.broken:
                    self.entry.instance.abort_transaction(10)
            raise SlotAborted(f"commit of {self.entry.txid} refused: {kafka_error(exc) or exc}") from None
        finally:
            self._release()

    def abort(self) -> None:
        if self.factory.exactly_once and not self.entry.broken:
            try:
                self.entry.instance.abort_transaction(10)
            except Exception as exc:
                self.entry.broken = True
                self._break_if_indefinite(exc)
        self._release()

    def _release(self) -> None:
        with _lock:
            self.entry.busy = False
            if self.entry.broken and self.number is not None:
                key = (self.factory.prefix, self.factory.sink, self.number)
                if _producers.get(key) is self.entry:
                    _producers.pop(key)
                _close(self.entry)
            elif self.entry.broken:
                _plain.pop((self.factory.prefix, self.factory.sink), None)

    def records(self) -> int:
        return self.records_written


# ---------------------------------------------------------------------------------------------
# Producing Arrow rows
# ---------------------------------------------------------------------------------------------


def produce_pairs(instance: Any, topic: str, pairs: Iterable[tuple[bytes | None, bytes | None]]) -> None:
    """Queue (key, value) pairs for `topic` with produce_batch (~1.5x faster than one produce()
    a record, but it carries no headers), waiting out a full queue."""
    pending = [{"key": k, "value": v} for k, v in pairs]
    while pending:
        with contextlib.suppress(BufferError):  # failed messages are marked with _error
            instance.produce_batch(topic, pending)
        failed = [m for m in pending if "_error" in m]
        for message in failed:
            error = message.pop("_error")
            if "QUEUE_FULL" not in str(error) and "Queue full" not in str(error):
                raise SlotAborted(f"producing to {topic} failed: {error}")
        pending = failed
        if pending:
            instance.poll(0.05)
    instance.poll(0)


def produce_rows(instance: Any, topic: str, batch: Any) -> int:
    """Queue every row of an Arrow batch (key, value, headers) for `topic`."""
    import pyarrow.compute as pc

    n = batch.num_rows
    if n == 0:
        return 0
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = batch.column("headers")
    has_headers = headers.null_count < n and pc.sum(pc.list_value_length(headers)).as_py()
    if not has_headers:
        produce_pairs(instance, topic, zip(keys, values, strict=True))
        return n
    produce = instance.produce
    for key, value, header in zip(keys, values, headers.to_pylist(), strict=True):
        header_pairs = [(h["key"], h["value"]) for h in header] if header else None
        while True:
            try:
                produce(topic, value, key, headers=header_pairs)
                break
            except BufferError:
                instance.poll(0.05)
    instance.poll(0)
    return n


def lingering(client: dict[str, Any], topics: list[str]) -> list[str]:
    """Partitions of `topics` whose last stable offset is below the high watermark: an open
    transaction holds every read_committed reader there."""
    from eos_connectors.kafka.clients import end_offsets

    admin = admin_client(client)
    found = []
    for topic in topics:
        try:
            partitions = {topic: describe_topics(admin, [topic])[topic].partitions}
        except (UnknownTopic, BrokerUnreachable):
            continue
        high = end_offsets(admin, partitions, read_committed=False)
        stable = end_offsets(admin, partitions, read_committed=True)
        found += [f"{t}/{p}: stable {stable[(t, p)]} < end {h}" for (t, p), h in high.items() if stable[(t, p)] < h]
    return found


__all__ = ["PRODUCER_BATCHING", "KafkaSink", "KafkaWriter", "KafkaWriterFactory", "produce_pairs", "produce_rows"]

"""The Delta Lake sink: two-phase commit on a Delta table's own log (Recovery.RESUME).

Per slot and epoch attempt, in a Spark task:
    write       the slot's rows as Parquet: append, data files in the table's (partition) folders,
                each named in a note first; upsert, the rows in the sink's staging folder
    pre-commit  a manifest of those files (paths, sizes, partition values, statistics) and the
                slot's ledger entry, written last; its path is the slot's handle
No version of the log names any of it: no reader sees it (eos_connectors.delta.staging).

On the driver, once every slot has pre-committed:
    agree       upsert: the epoch's rows must hold one row per key (else nothing is decided)
    commit      after the recorded decision: ONE Delta version with every slot's files (append:
                their add actions; upsert: a MERGE of the staged rows by key) and the application
                transaction (eos/<pipeline>/<sink>, epoch), the slots' ledger entries in its
                commitInfo (eos_connectors.delta.ledger); then the staging files go
After a crash, `resolve` commits exactly the staged attempts the recorded decision names, unless
the table's txn version shows they committed, and removes every other staged attempt; the replay
then writes only the slots the log does not show committed.

A commit checks the txn version before it commits and delta-rs checks it again at commit (a
version that another writer committed meanwhile with the same app id is a conflict, not a second
commit), so neither a zombie driver nor any other writer can make an epoch commit twice.

At-least-once mode: each slot commits its own files (or MERGEs its rows) at once, without txn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from eos.api import (
    ConfigError,
    Decision,
    Ledger,
    LedgerEntry,
    Permanent,
    PipelineInfo,
    Prepared,
    Recovery,
    SinkConnector,
    SlotAborted,
    SlotContext,
    SlotWriter,
    WriterFactory,
)
from eos_connectors.delta import ledger, staging
from eos_connectors.delta.config import DeltaSinkEntry, secret_option
from eos_connectors.delta.staging import Manifest, StagedFile
from eos_connectors.delta.table import (
    FileStats,
    Store,
    arrow_schema,
    check_compatible,
    check_partition_columns,
    check_writable,
    open_table,
    partition_folder,
    partition_value,
    resolve_uri,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

log = logging.getLogger("eos.delta")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def _between_check_and_commit(table: DeltaTable) -> None:
    """Nothing: where a test lets another writer commit between eos's txn check and its commit."""


class DeltaSink(SinkConnector):
    kind = "delta"
    entry_model = DeltaSinkEntry
    recovery = Recovery.RESUME
    reach_settings = ("storage_options", "create_table")  # storage options may hold credentials
    entry: DeltaSinkEntry

    def __init__(self, entry: DeltaSinkEntry, pipeline: PipelineInfo, view: str | None = None):
        super().__init__(entry, pipeline)
        self.uri = resolve_uri(entry.delta.table, pipeline.base_dir)
        self._store: Store | None = None
        self._schema: pa.Schema | None = None  # the files' columns, in the table's Arrow types (rows())
        self._not_null: tuple[str, ...] = ()
        self._partition_by: tuple[str, ...] = ()
        self._agreed: dict[tuple[str, ...], pa.Table] = {}  # upsert: rows read by agree(), for commit()
        self._lock = threading.Lock()

    @property
    def section(self):
        return self.entry.delta

    @property
    def options(self) -> dict[str, str]:
        return dict(self.section.storage_options)

    @property
    def app_id(self) -> str:
        return ledger.app_id(self.pipeline.name, self.name)

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = Store(self.uri, self.options)
            return self._store

    def table(self) -> DeltaTable | None:
        try:
            return open_table(self.uri, self.options)
        except Exception as exc:
            raise SlotAborted(
                f"sink {self.name}: cannot open the Delta table at {self.uri}: {_first_line(exc)}"
            ) from None

    # -- identity ----------------------------------------------------------------------------
    def describe(self) -> str:
        s = self.section
        how = f"upsert (MERGE) on ({', '.join(s.key or [])})" if s.mode == "upsert" else "append"
        return (
            f"Delta table {self.uri} ({how}), app transaction {self.app_id}, staged in "
            f"{staging.folder(self.pipeline.name, self.name)}/"
        )

    def system(self) -> str:
        return f"delta {self.uri}"

    # -- checks ------------------------------------------------------------------------------
    def check(self, spark: Any) -> None:
        table = self.table()
        if table is None:
            if not self.section.create_table:
                raise ConfigError(
                    f"sink {self.name}: there is no Delta table at {self.uri}",
                    hint="create it, or set `create_table: true` in the sink's delta section",
                )
            return
        check_writable(self.name, self.uri, table, self.section.mode)

    # -- rows and writers ----------------------------------------------------------------------
    def rows(self, view: DataFrame) -> DataFrame:
        columns = self.section.columns
        if columns:
            view = view.selectExpr(*(f"{expression} AS {_backquote(name)}" for name, expression in columns.items()))
        for name in view.columns:
            if name.startswith("_eos_"):
                raise ConfigError(f"sink {self.name}: column {name!r}: names starting with _eos_ are eos's own")
        self._prepare_table(arrow_schema(view.schema))
        return view

    def _prepare_table(self, rows: pa.Schema) -> None:
        """Check the table (or create it) against the rows' columns."""
        import pyarrow as pa
        from deltalake import DeltaTable, Schema

        s = self.section
        check_partition_columns(self.name, Schema.from_arrow(rows), list(s.partition_by or []))
        if s.mode == "upsert":
            missing = [k for k in s.key or [] if k not in rows.names]
            if missing:
                raise ConfigError(
                    f"sink {self.name}: key columns {missing} are not among the rows' columns {rows.names}"
                )
        table = self.table()
        if table is None:
            if not s.create_table:
                raise ConfigError(f"sink {self.name}: there is no Delta table at {self.uri}")
            DeltaTable.create(
                self.uri, rows, mode="ignore", partition_by=list(s.partition_by or []) or None,
                storage_options=self.options or None,
            )  # fmt: skip
            log.warning("sink %s: created the Delta table at %s", self.name, self.uri)
            table = self.table()
            assert table is not None
        check_compatible(self.name, self.uri, table, rows, s.partition_by)
        check_writable(self.name, self.uri, table, s.mode)
        types = pa.schema(table.schema().to_arrow())
        self._schema = pa.schema([types.field(name) for name in rows.names])
        self._not_null = tuple(f.name for f in table.schema().fields if not f.nullable and f.name in rows.names)
        self._partition_by = tuple(table.metadata().partition_columns)

    def writer(self) -> DeltaWriterFactory:
        if self._schema is None:
            raise ConfigError(f"sink {self.name}: writer() before rows(): the table was not checked")
        return DeltaWriterFactory(
            uri=self.uri,
            options=self.options,
            pipeline=self.pipeline.name,
            sink=self.name,
            mode=self.section.mode,
            key=tuple(self.section.key or ()),
            schema=self._schema,
            partition_by=self._partition_by,
            not_null=self._not_null,
            exactly_once=self.pipeline.exactly_once,
        )

    # -- agree, commit, discard (driver) ---------------------------------------------------------
    def agree(self, prepared: list[Prepared]) -> None:
        """Upsert: a Delta MERGE needs one row per key in its source. The epoch's rows are read
        and checked here, before the decision: a key twice (in one slot or in two) stops the
        pipeline with nothing of the epoch committed anywhere."""
        if self.section.mode != "upsert" or not prepared:
            return
        manifests = self._manifests(prepared)
        rows = self._staged_rows(manifests)
        _check_one_row_per_key(self.name, manifests[0].epoch, rows, list(self.section.key or []))
        self._agreed = {tuple(sorted(p.handle for p in prepared)): rows}

    def commit(self, prepared: list[Prepared]) -> None:
        manifests = self._manifests(prepared)
        rows = self._agreed.pop(tuple(sorted(p.handle for p in prepared)), None)
        self._commit(manifests, rows if len(manifests) == len(prepared) else None)
        self._unstage(manifests)

    def discard(self, prepared: list[Prepared]) -> None:
        """Pre-commits of retried task attempts: nobody will commit them."""
        for p in prepared:
            found = [a for a in staging.attempts(self.store, self.pipeline.name, self.name) if a.manifest == p.handle]
            for attempt in found:
                self._remove_attempt(attempt, committed_up_to=None)

    def _manifests(self, prepared: list[Prepared]) -> list[Manifest]:
        found = []
        for p in prepared:
            try:
                manifest = staging.read(self.store, p.handle)
            except Exception as exc:
                raise SlotAborted(f"sink {self.name}: reading {p.handle} failed: {_first_line(exc)}") from None
            if manifest is None:
                if self._committed_handle(p.slot) == p.handle:
                    continue  # a commit repeated after its outcome was lost: the log shows it
                raise SlotAborted(
                    f"sink {self.name}: the staged files of {p.handle} are gone and the table does not show them "
                    "committed (someone removed them); the slot's rows are written again"
                )
            found.append(manifest)
        return found

    def _committed_handle(self, slot: int) -> str | None:
        table = self.table()
        if table is None:
            return None
        entry = ledger.read(table, self.pipeline.name, self.name, self.pipeline.checkpoint_id).get((self.name, slot))
        return entry.extra.get("handle") if entry is not None else None

    def _commit(self, manifests: list[Manifest], rows: pa.Table | None = None) -> int:
        """ONE Delta version with these slots' data and the txn (eos/<pipeline>/<sink>, epoch);
        slots the log already shows committed are left out. Returns how many slots it committed."""
        if not manifests:
            return 0
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        epoch = manifests[0].epoch
        if any(m.epoch != epoch for m in manifests):
            raise SlotAborted(f"sink {self.name}: one commit cannot hold several epochs")
        table = self.table()
        if table is None:
            raise SlotAborted(f"sink {self.name}: the Delta table at {self.uri} is gone")
        todo = self._not_yet(table, manifests)
        if not todo:
            return 0
        info = ledger.commit_info(
            self.pipeline.name, self.name, epoch, [m.ledger_entry() for m in todo], [m.handle for m in todo]
        )
        properties = CommitProperties(custom_metadata=info, app_transactions=[Transaction(self.app_id, epoch)])
        _between_check_and_commit(table)
        try:
            if self.section.mode == "upsert":
                if rows is None or len(todo) != len(manifests):  # `rows` are every manifest's
                    rows = self._staged_rows(todo)
                merge(table, rows, list(self.section.key or []), properties)
            else:
                table.create_write_transaction(
                    [_add_action(f) for m in todo for f in m.files], "append", table.schema(),
                    partition_by=list(table.metadata().partition_columns),
                    commit_properties=properties,
                )  # fmt: skip
        except CommitFailedError as exc:
            # Another version set this app id after the check: a concurrent writer, or this very
            # commit whose outcome was lost and which delta-rs retried. Only the log can tell.
            again = self.table()
            if again is not None and not self._not_yet(again, todo):
                return len(todo)
            raise SlotAborted(
                f"sink {self.name}: epoch {epoch} was not committed to {self.uri}: another writer committed "
                f"{self.app_id} at the same time ({_first_line(exc)})"
            ) from None
        except Exception as exc:
            raise SlotAborted(
                f"sink {self.name}: committing epoch {epoch} to {self.uri} failed: {_first_line(exc)}"
            ) from None
        return len(todo)

    def _not_yet(self, table: DeltaTable, manifests: list[Manifest]) -> list[Manifest]:
        """The manifests whose slot the table's log does not show committed for their epoch."""
        epoch = manifests[0].epoch
        last = ledger.committed_epoch(table, self.pipeline.name, self.name)
        if last is not None and last > epoch:
            raise SlotAborted(
                f"sink {self.name}: the Delta table at {self.uri} shows epoch {last} committed, after epoch {epoch} "
                "that this commit is for: it is stale and is not made"
            )
        done = ledger.read(table, self.pipeline.name, self.name, self.pipeline.checkpoint_id) if last == epoch else {}
        todo = []
        for m in manifests:
            entry = done.get((self.name, m.slot))
            if entry is None:
                todo.append(m)
            elif entry.extra.get("handle") != m.handle:
                raise SlotAborted(
                    f"sink {self.name}: slot {m.slot} committed epoch {epoch} from {entry.extra.get('handle')}, not "
                    f"from {m.handle}: the table was written by another driver"
                )
        return todo

    def _staged_rows(self, manifests: list[Manifest]) -> pa.Table:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for m in manifests:
            for f in m.files:
                try:
                    tables.append(pq.read_table(pa.BufferReader(self.store.get(f.path))))
                except FileNotFoundError:
                    raise SlotAborted(f"sink {self.name}: staged rows {f.path} of {m.handle} are gone") from None
        if not tables:
            table = self.table()
            assert table is not None
            return pa.schema(table.schema().to_arrow()).empty_table()
        return pa.concat_tables(tables)

    def _unstage(self, manifests: list[Manifest]) -> None:
        """After the commit: the staging files of these attempts (never the data files)."""
        paths = []
        for m in manifests:
            folder = staging.folder(self.pipeline.name, self.name)
            name = staging.stem_of(m.handle)
            paths += [f.path for f in m.files if f.path.startswith(staging.ROOT + "/")]
            paths += [f"{folder}/{name}.file-{n}" for n in range(len(m.files))]
            paths.append(m.handle)
        try:
            self.store.delete(paths)
        except Exception as exc:  # committed all the same; recovery removes them
            log.warning("sink %s: could not remove staging files after the commit: %s", self.name, exc)

    def _remove_attempt(self, attempt: staging.Attempt, committed_up_to: int | None) -> None:
        """An attempt nobody will commit: its data files, then its staging files. A data file the
        table's log names is kept (it can only be there by a commit: never delete what is in use)."""
        files = staging.data_files(self.store, attempt)
        if files and committed_up_to is not None and attempt.epoch <= committed_up_to:
            table = self.table()
            if table is not None:
                used = {unquote(str(p)) for p in table.get_add_actions().column("path").to_pylist()}
                files = [f for f in files if f not in used]
        self.store.delete(files)
        self.store.delete(list(attempt.paths))

    # -- recovery (driver) ---------------------------------------------------------------------
    def resolve_staged(self, decision: Decision | None) -> list[tuple[str, str]]:
        """Commit the staged attempts the recorded decision names (unless the log shows them
        committed), remove every other one. Returns (attempt, what was done) in order."""
        attempts = staging.attempts(self.store, self.pipeline.name, self.name)
        if not attempts:
            return []
        decided = set(decision.prepared.get(self.name, ())) if decision is not None else set()
        chosen: list[Manifest] = []
        missing: set[str] = set()
        for attempt in attempts:
            if attempt.manifest in decided:
                manifest = staging.read(self.store, attempt.manifest)
                if manifest is None:
                    continue
                if any(self.store.size(f.path) is None for f in manifest.files):
                    missing.add(attempt.stem)  # removed behind eos's back (VACUUM): the replay writes it
                    log.error("sink %s: files of %s are gone: the slot is written again", self.name, manifest.handle)
                    continue
                chosen.append(manifest)
        by_epoch: dict[int, list[Manifest]] = {}
        for manifest in chosen:
            by_epoch.setdefault(manifest.epoch, []).append(manifest)
        for group in by_epoch.values():
            self._commit(group)
        done = []
        table = self.table()
        last = ledger.committed_epoch(table, self.pipeline.name, self.name) if table is not None else None
        kept = {staging.stem_of(m.handle) for m in chosen}
        for attempt in attempts:
            if attempt.stem in kept:
                self.store.delete(list(attempt.paths))
                done.append((attempt.manifest or attempt.stem, "committed"))
            else:
                self._remove_attempt(attempt, committed_up_to=last)
                done.append((attempt.manifest or attempt.stem, "rolled back"))
        return done

    @classmethod
    def resolve(cls, sinks: list[SinkConnector], decision: Decision | None) -> dict[str, int]:
        counts = {"committed": 0, "rolled back": 0}
        for sink in sinks:
            assert isinstance(sink, DeltaSink)
            try:
                done = sink.resolve_staged(decision)
            except SlotAborted:
                raise
            except Exception as exc:
                raise SlotAborted(
                    f"sink {sink.name}: resolving staged files in {sink.uri} failed: {_first_line(exc)}"
                ) from None
            for _, what in done:
                counts[what] += 1
            if done:
                by = f" (decision: epoch {decision.epoch} attempt {decision.attempt})" if decision else " (no decision)"
                log.warning(
                    "pipeline %s: sink %s: committed %d and removed %d staged attempts left in %s%s",
                    sink.pipeline.name, sink.name, sum(w == "committed" for _, w in done),
                    sum(w == "rolled back" for _, w in done), sink.uri, by,
                )  # fmt: skip
        return counts

    @classmethod
    def read_ledger(cls, sinks: list[SinkConnector]) -> Ledger:
        found: Ledger = {}
        for sink in sinks:
            assert isinstance(sink, DeltaSink)
            table = sink.table()
            if table is None:
                continue
            try:
                found.update(ledger.read(table, sink.pipeline.name, sink.name, sink.pipeline.checkpoint_id))
            except Exception as exc:
                raise SlotAborted(f"reading the Delta log of {sink.uri} failed: {_first_line(exc)}") from None
        return found

    def forget(self) -> None:
        """`eos reset`: remove what is staged, and set the app transaction to -1 (nothing
        committed) in an empty version: a log cannot be edited, only added to."""
        from deltalake import CommitProperties, Transaction

        for attempt in staging.attempts(self.store, self.pipeline.name, self.name):
            self._remove_attempt(attempt, committed_up_to=None)
        table = self.table()
        if table is None or ledger.committed_epoch(table, self.pipeline.name, self.name) is None:
            return
        properties = CommitProperties(
            custom_metadata=ledger.reset_info(self.pipeline.name, self.name),
            app_transactions=[Transaction(self.app_id, ledger.NOTHING)],
        )
        table.create_write_transaction(
            [], "append", table.schema(), partition_by=list(table.metadata().partition_columns),
            commit_properties=properties,
        )  # fmt: skip

    def lingering(self) -> list[str]:
        """Staged attempts left in the table's folder: invisible to readers, but files on disk."""
        now = time.time()
        out = []
        for attempt in staging.attempts(self.store, self.pipeline.name, self.name):
            data = staging.data_files(self.store, attempt)
            manifest = staging.read(self.store, attempt.manifest) if attempt.manifest else None
            state = (
                f"pre-committed {now - manifest.written_at:.0f} s ago" if manifest else "incomplete (its writer died)"
            )
            out.append(
                f"{attempt.stem}: {len(data)} staged data files, {state}, in "
                f"{self.uri}/{staging.folder(self.pipeline.name, self.name)}/"
            )
        return out


def merge(table: DeltaTable, rows: pa.Table, key: list[str], properties: Any) -> None:
    """Upsert: a Delta MERGE by `key` (every column updated or inserted), in one version with
    `properties` (the txn). An empty source makes no version in delta-rs: the txn still must."""
    if rows.num_rows == 0:
        table.create_write_transaction(
            [], "append", table.schema(), partition_by=list(table.metadata().partition_columns),
            commit_properties=properties,
        )  # fmt: skip
        return
    predicate = " AND ".join(f't."{k}" = s."{k}"' for k in key)
    merger = table.merge(rows, predicate, source_alias="s", target_alias="t", commit_properties=properties)
    merger.when_matched_update_all().when_not_matched_insert_all().execute()


def _check_one_row_per_key(sink: str, epoch: int, rows: pa.Table, key: list[str]) -> None:
    import pyarrow.compute as pc

    nulls = [k for k in key if rows.column(k).null_count]
    if nulls:
        raise Permanent(
            f"sink {sink}: epoch {epoch} has rows whose key column {', '.join(nulls)} is null: a MERGE cannot match "
            "them (nothing of the epoch was committed)",
            hint="filter out or fill in null keys in a transform",
        )
    counts = rows.group_by(key).aggregate([([], "count_all")])
    twice = counts.filter(pc.greater(counts.column("count_all"), 1))
    if twice.num_rows:
        examples = ", ".join(str({k: row[k] for k in key}) for row in twice.slice(0, 3).to_pylist())
        raise Permanent(
            f"sink {sink}: epoch {epoch} has {twice.num_rows} keys with more than one row (e.g. {examples}): a Delta "
            "MERGE needs one row per key per epoch (nothing of the epoch was committed)",
            hint="aggregate or deduplicate by the key in a transform (GROUP BY the key, or eos.transforms:"
            "drop_duplicates) before the sink",
        )


def _add_action(f: StagedFile) -> Any:
    from deltalake.transaction import AddAction

    # The path as it is on the filesystem: delta-rs percent-encodes it into the log's URI form.
    return AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)


def _backquote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# ---------------------------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------------------------

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], Store] = {}
_stores_lock = threading.Lock()


def _store(uri: str, options: dict[str, str]) -> Store:
    """One store per table and process (a Python worker writes many slots)."""
    key = (uri, tuple(sorted(options.items())))
    with _stores_lock:
        if key not in _stores:
            _stores[key] = Store(uri, options)
        return _stores[key]


@dataclass(frozen=True)
class DeltaWriterFactory(WriterFactory):
    uri: str
    options: dict[str, str]
    pipeline: str
    sink: str
    mode: str
    key: tuple[str, ...]
    schema: Any  # pa.Schema: the files' columns in the table's types
    partition_by: tuple[str, ...]
    not_null: tuple[str, ...]
    exactly_once: bool

    def open(self, ctx: SlotContext) -> DeltaWriter:
        return DeltaWriter(self, ctx)

    def __repr__(self) -> str:  # never show the storage options
        shown = {k: "***" if secret_option(k) else v for k, v in self.options.items()}
        return f"DeltaWriterFactory(sink={self.sink!r}, uri={self.uri!r}, mode={self.mode!r}, options={shown})"


class _OpenFile:
    """A Parquet file being written, in memory until it is put in the store in one piece."""

    def __init__(self, path: str, schema: pa.Schema, partition_values: dict[str, str | None]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = path
        self.partition_values = partition_values
        self.buffer = pa.BufferOutputStream()
        self.writer = pq.ParquetWriter(self.buffer, schema)
        self.stats = FileStats(schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.stats.add(batch)

    def finish(self, store: Store) -> StagedFile:
        self.writer.close()
        data = self.buffer.getvalue().to_pybytes()
        store.put(self.path, data)
        return StagedFile(self.path, len(data), self.partition_values, int(time.time() * 1000), self.stats.to_json())


class DeltaWriter(SlotWriter):
    def __init__(self, factory: DeltaWriterFactory, ctx: SlotContext):
        self.factory = factory
        self.ctx = ctx
        self.store = _store(factory.uri, factory.options)
        self.stem = staging.stem(ctx.epoch, ctx.attempt, ctx.slot, ctx.task_attempt, uuid.uuid4().hex[:12])
        self.folder = staging.folder(factory.pipeline, factory.sink)
        self.files: dict[tuple[tuple[str, str | None], ...], _OpenFile] = {}
        self.written = 0
        self.state = "open"  # open -> prepared | committed | done
        data = [f for f in factory.schema if f.name not in factory.partition_by]
        import pyarrow as pa

        self.data_schema = pa.schema(data)

    # -- SlotWriter ----------------------------------------------------------------------------
    def write(self, batch: Any) -> None:
        import pyarrow as pa

        f = self.factory
        batch = pa.RecordBatch.from_arrays(
            [batch.column(name).cast(field.type) for name, field in zip(f.schema.names, f.schema, strict=True)],
            schema=f.schema,
        )
        for name in f.not_null:
            if batch.column(name).null_count:
                raise Permanent(
                    f"sink {f.sink} slot {self.ctx.slot}: column {name!r} is NOT NULL in the Delta table at {f.uri}, "
                    "and a row has null there",
                    hint="fill the column in a transform, or make it nullable in the table",
                )
        if f.mode == "upsert":
            if () not in self.files:
                self.files[()] = _OpenFile(f"{self.folder}/{self.stem}.rows-0.parquet", f.schema, {})
            self.files[()].write(batch)
        else:
            for values, part in _by_partition(batch, f.partition_by):
                key = tuple(values.items())
                if key not in self.files:
                    path = f"{partition_folder(values)}eos-{self.stem}-{len(self.files)}.parquet"
                    staging.note(self.store, f.pipeline, f.sink, self.stem, len(self.files), path)
                    self.files[key] = _OpenFile(path, self.data_schema, values)
                self.files[key].write(part.select(self.data_schema.names))
        self.written += batch.num_rows

    def precommit(self, entry: LedgerEntry) -> Prepared:
        f = self.factory
        try:
            files = [file.finish(self.store) for file in self.files.values()]
            if not f.exactly_once:
                self._commit_at_once(files)
                self.state = "committed"
                return Prepared(f.sink, self.ctx.slot, "", self.written, self.ctx.task_attempt)
            manifest = Manifest(
                handle=staging.handle(f.pipeline, f.sink, self.stem), pipeline=f.pipeline, sink=f.sink,
                slot=self.ctx.slot, epoch=self.ctx.epoch, attempt=self.ctx.attempt,
                task_attempt=self.ctx.task_attempt, mode=f.mode, entry=dataclasses.asdict(entry), files=tuple(files),
            )  # fmt: skip
            staging.write(self.store, manifest)
        except (Permanent, SlotAborted):
            raise
        except Exception as exc:
            raise SlotAborted(
                f"sink {f.sink} slot {self.ctx.slot}: staging in {f.uri} failed: {_first_line(exc)}"
            ) from None
        self.state = "prepared"
        return Prepared(f.sink, self.ctx.slot, manifest.handle, self.written, self.ctx.task_attempt)

    def _commit_at_once(self, files: list[StagedFile]) -> None:
        """At-least-once: this slot's own version, no txn (a replay writes its rows again)."""
        from deltalake import DeltaTable

        f = self.factory
        table = DeltaTable(f.uri, storage_options=f.options or None)
        if f.mode == "upsert":
            import pyarrow as pa
            import pyarrow.parquet as pq

            if files:
                merge(table, pq.read_table(pa.BufferReader(self.store.get(files[0].path))), list(f.key), None)
            self.store.delete([x.path for x in files])
        elif files:
            table.create_write_transaction(
                [_add_action(x) for x in files], "append", table.schema(), partition_by=list(f.partition_by)
            )
            self.store.delete([f"{self.folder}/{self.stem}.file-{n}" for n in range(len(files))])

    def abort(self) -> None:
        """The task failed: what this writer staged goes (recovery removes whatever is left)."""
        if self.state in ("committed", "done"):
            return
        paths = [file.path for file in self.files.values()]
        paths += [f"{self.folder}/{self.stem}.file-{n}" for n in range(len(self.files))]
        paths.append(staging.handle(self.factory.pipeline, self.factory.sink, self.stem))
        with contextlib.suppress(Exception):
            self.store.delete(paths)
        self.state = "done"

    def records(self) -> int:
        return self.written


def _by_partition(batch: pa.RecordBatch, columns: tuple[str, ...]) -> Any:
    """(partition values, rows) for each distinct combination of the partition columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not columns:
        yield {}, batch
        return
    combos = pa.Table.from_batches([batch]).select(list(columns)).group_by(list(columns)).aggregate([])
    for combo in combos.to_pylist():
        mask = None
        for name in columns:
            value = combo[name]
            test = pc.is_null(batch.column(name)) if value is None else pc.equal(batch.column(name), value)
            mask = test if mask is None else pc.and_(mask, test)
        yield {name: partition_value(combo[name]) for name in columns}, batch.filter(mask)


__all__ = ["DeltaSink", "DeltaWriter", "DeltaWriterFactory"]

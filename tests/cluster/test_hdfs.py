"""PySpark against a real HDFS: a NameNode and a DataNode JVM from the Apache Hadoop jars.

One HDFS for the whole module (a cold start costs ~10-20 s). What is checked is what eos relies
on when its checkpoint lives on HDFS: PySpark's bundled Hadoop client talks to the servers,
the FileSystem API's create/rename semantics (eos writes small metadata files temp-then-rename),
Structured Streaming checkpoints on hdfs://, and what a client sees while the NameNode restarts.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from eos_ops import jvm
from eos_ops.hdfs import RESTART_TOLERANT_CLIENT, LocalHdfs, hadoop_version
from tests.support_hdfs import missing_classes

pytestmark = pytest.mark.slow

CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"


@pytest.fixture(scope="module")
def hdfs_and_spark(hdfs: LocalHdfs) -> Iterator[tuple[LocalHdfs, Any]]:
    """The session's HDFS (tests/cluster/conftest.py) and a Spark session set up for hdfs://."""
    with spark_for_hdfs() as session:
        yield hdfs, session


@contextmanager
def spark_for_hdfs() -> Iterator[Any]:
    """local[2] from eos's build_spark, told the checkpoint is on HDFS.

    In a full test run the session may already exist, built for local checkpoints with Spark's
    FileSystem-based checkpoint manager; on hdfs:// eos wants Spark's default (FileContext-based,
    atomic rename), so that one setting is lifted for this module and restored after."""
    from pyspark.sql import SparkSession

    from eos.sparksession import build_spark

    existed = SparkSession.getActiveSession() is not None
    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    session = build_spark("eos-hdfs-tests", master="local[2]", conf=conf, checkpoint="hdfs://any/checkpoints")
    local_manager = session.conf.get(CHECKPOINT_MANAGER_KEY, None)
    if local_manager:
        session.conf.unset(CHECKPOINT_MANAGER_KEY)
    try:
        yield session
    finally:
        if local_manager:
            session.conf.set(CHECKPOINT_MANAGER_KEY, local_manager)
        if not existed:
            session.stop()


@pytest.fixture(scope="module")
def spark(hdfs_and_spark: tuple[LocalHdfs, Any]):
    """Shadows the suite's `spark` fixture here: the same session when it exists, set up for hdfs://."""
    return hdfs_and_spark[1]


@pytest.fixture(scope="module")
def url(hdfs: LocalHdfs) -> str:
    assert hdfs.url.startswith("hdfs://127.0.0.1:")
    return hdfs.url


def unique(prefix: str) -> str:
    return f"/{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# py4j helpers for Hadoop's FileSystem API
# ---------------------------------------------------------------------------------------------


class Fs:
    """A Hadoop FileSystem in Spark's JVM, taking and giving Python str paths and bytes."""

    def __init__(self, spark, jfs):
        self.jvm = spark._jvm
        self.gateway = spark.sparkContext._gateway
        self.jfs = jfs

    @classmethod
    def get(cls, spark, url: str) -> Fs:
        """FileSystem.get: the instance Spark itself uses (cached per scheme, host and user)."""
        jvm = spark._jvm
        return cls(spark, jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(url), hadoop_conf(spark)))

    @classmethod
    def new(cls, spark, url: str, settings: dict[str, str] | None = None) -> Fs:
        """A private, uncached instance: `settings` only take effect on a FileSystem made with them."""
        jvm = spark._jvm
        conf = jvm.org.apache.hadoop.conf.Configuration(hadoop_conf(spark))
        for key, value in (settings or {}).items():
            conf.set(key, value)
        return cls(spark, jvm.org.apache.hadoop.fs.FileSystem.newInstance(jvm.java.net.URI(url), conf))

    def path(self, path: str):
        return self.jvm.org.apache.hadoop.fs.Path(path)

    def write(self, path: str, data: bytes, overwrite: bool = False) -> None:
        out = self.jfs.create(self.path(path), overwrite)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def read(self, path: str) -> bytes:
        stream = self.jfs.open(self.path(path))
        try:
            return bytes(self.jvm.org.apache.hadoop.io.IOUtils.readFullyToByteArray(stream))
        finally:
            stream.close()

    def exists(self, path: str) -> bool:
        return self.jfs.exists(self.path(path))

    def rename(self, src: str, dst: str) -> bool:
        """FileSystem.rename(src, dst): the old API, which answers with a boolean."""
        return self.jfs.rename(self.path(src), self.path(dst))

    def rename_with(self, src: str, dst: str, option: str) -> None:
        """rename(src, dst, Options.Rename...): HDFS's rename that raises instead (NONE or OVERWRITE)."""
        rename = self.jvm.org.apache.hadoop.fs.Options.Rename
        options = self.gateway.new_array(rename, 1)
        options[0] = getattr(rename, option)
        self.jfs.rename(self.path(src), self.path(dst), options)

    def names(self, path: str) -> list[str]:
        return sorted(status.getPath().getName() for status in self.jfs.listStatus(self.path(path)))

    def delete(self, path: str, recursive: bool = True) -> bool:
        return self.jfs.delete(self.path(path), recursive)


def hadoop_conf(spark):
    return spark.sparkContext._jsc.hadoopConfiguration()


def java_error(call: Callable[[], Any]) -> str:
    """Run `call`, which must fail in the JVM; returns 'JavaExceptionClass: message' (first line)."""
    from py4j.protocol import Py4JJavaError

    with pytest.raises(Py4JJavaError) as failure:
        call()
    error = failure.value.java_exception
    return f"{error.getClass().getName()}: {(error.getMessage() or '').splitlines()[0]}"


# ---------------------------------------------------------------------------------------------
# The server version
# ---------------------------------------------------------------------------------------------


def test_server_jars_are_the_hadoop_version_pyspark_bundles():
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    bundled = [re.match(r"hadoop-client-api-(.+)\.jar$", jar.name) for jar in jars.glob("hadoop-client-api-*.jar")]
    versions = {match.group(1) for match in bundled if match}
    assert versions == {hadoop_version()}, f"PySpark bundles Hadoop {versions}; ops/hadoop/pom.xml pins another"


# ---------------------------------------------------------------------------------------------
# (a) Spark reads and writes datasets on HDFS
# ---------------------------------------------------------------------------------------------


def test_spark_writes_and_reads_parquet_and_text_on_hdfs(spark, url: str):
    base = url + unique("datasets")
    numbers = spark.range(0, 1000).selectExpr("id", "id * id AS square")
    numbers.write.parquet(f"{base}/numbers")
    back = spark.read.parquet(f"{base}/numbers")
    assert back.count() == 1000
    assert back.selectExpr("sum(id)", "sum(square)").first() == (499500, 332833500)

    spark.range(5).selectExpr("CAST(id AS STRING) AS value").write.text(f"{base}/lines")
    assert sorted(row.value for row in spark.read.text(f"{base}/lines").collect()) == ["0", "1", "2", "3", "4"]

    fs = Fs.get(spark, url)
    assert fs.jfs.getClass().getName() == "org.apache.hadoop.hdfs.DistributedFileSystem"
    assert "_SUCCESS" in fs.names(f"{base}/numbers")


# ---------------------------------------------------------------------------------------------
# (b) The FileSystem API: create, rename, list, delete
# ---------------------------------------------------------------------------------------------


def test_create_never_replaces_an_existing_file_unless_told(spark, url: str):
    fs, base = Fs.get(spark, url), unique("create")
    fs.write(f"{base}/a", b"first")
    error = java_error(lambda: fs.write(f"{base}/a", b"second"))
    assert error.startswith("org.apache.hadoop.fs.FileAlreadyExistsException")
    assert fs.read(f"{base}/a") == b"first"
    fs.write(f"{base}/a", b"second", overwrite=True)
    assert fs.read(f"{base}/a") == b"second"


def test_a_file_being_written_is_visible_under_its_name_before_close(spark, url: str):
    """Why eos writes to a temporary name and renames: readers see a file while it is written."""
    fs, path = Fs.get(spark, url), unique("open") + "/file"
    out = fs.jfs.create(fs.path(path), False)
    out.write(bytearray(b"0123456789"))
    out.hflush()
    assert fs.exists(path)
    assert fs.read(path) == b"0123456789"  # flushed bytes, while the writer may still add more
    out.write(bytearray(b"abc"))
    out.close()
    assert fs.read(path) == b"0123456789abc"


def test_overwrite_takes_a_file_away_from_a_writer_that_still_has_it_open(spark, url: str):
    """create(overwrite=True) does not wait for, nor fail on, another writer: the first one loses."""
    fs, path = Fs.get(spark, url), unique("steal") + "/file"
    first = fs.jfs.create(fs.path(path), False)
    first.write(bytearray(b"first"))
    first.hflush()
    fs.write(path, b"second", overwrite=True)
    # The first writer's close fails one of two ways, depending on a race: at the NameNode, which
    # took its lease (RemoteException(FileNotFoundException)), or first at the DataNode, which has
    # already dropped the old file's block and breaks the write pipeline ("All datanodes ... are
    # bad": seen once, in a clean-clone run of 2026-11-25).
    error = java_error(first.close)
    lost_lease = "File does not exist" in error and "does not have any open files" in error
    lost_block = error.startswith("java.io.IOException: All datanodes") and "are bad" in error
    assert lost_lease or lost_block, error
    assert fs.read(path) == b"second"


def test_rename_onto_a_new_name_moves_the_file(spark, url: str):
    fs, base = Fs.get(spark, url), unique("rename")
    fs.write(f"{base}/tmp", b"payload")
    assert fs.rename(f"{base}/tmp", f"{base}/final") is True
    assert not fs.exists(f"{base}/tmp")
    assert fs.read(f"{base}/final") == b"payload"


def test_rename_onto_an_existing_file_returns_false_and_changes_nothing(spark, url: str):
    fs, base = Fs.get(spark, url), unique("rename")
    fs.write(f"{base}/tmp", b"new")
    fs.write(f"{base}/final", b"old")
    assert fs.rename(f"{base}/tmp", f"{base}/final") is False
    assert fs.read(f"{base}/final") == b"old"
    assert fs.read(f"{base}/tmp") == b"new"


def test_rename_false_cases_and_the_surprising_true_ones(spark, url: str):
    """The boolean API says false for a missing source or parent, but true in two traps."""
    fs, base = Fs.get(spark, url), unique("rename")
    fs.write(f"{base}/a", b"a")
    assert fs.rename(f"{base}/missing", f"{base}/b") is False
    assert fs.rename(f"{base}/a", f"{base}/no-such-dir/a") is False
    # Onto itself: true, nothing happens.
    assert fs.rename(f"{base}/a", f"{base}/a") is True
    # Onto an existing directory: true, and the file moves INTO it (dir/a), not onto it.
    fs.jfs.mkdirs(fs.path(f"{base}/dir"))
    assert fs.rename(f"{base}/a", f"{base}/dir") is True
    assert fs.names(f"{base}/dir") == ["a"]


def test_rename_with_options_raises_instead_of_returning_false(spark, url: str):
    """DistributedFileSystem.rename(src, dst, Rename...), which Spark's FileContext-based checkpoint
    manager uses: NONE fails if the target exists, OVERWRITE replaces a file in one step."""
    fs, base = Fs.get(spark, url), unique("rename-options")
    fs.write(f"{base}/tmp", b"new")
    fs.write(f"{base}/final", b"old")
    error = java_error(lambda: fs.rename_with(f"{base}/tmp", f"{base}/final", "NONE"))
    assert error.startswith("org.apache.hadoop.fs.FileAlreadyExistsException: rename destination")
    assert fs.read(f"{base}/final") == b"old"

    fs.rename_with(f"{base}/tmp", f"{base}/final", "OVERWRITE")
    assert fs.read(f"{base}/final") == b"new"
    assert not fs.exists(f"{base}/tmp")

    error = java_error(lambda: fs.rename_with(f"{base}/final", f"{base}/missing-dir/final", "NONE"))
    assert error.startswith("java.io.FileNotFoundException: rename destination parent")


def test_concurrent_renames_onto_one_name_have_exactly_one_winner(spark, url: str):
    """The NameNode serialises renames: of N writers racing to publish, one wins, whole."""
    fs, base = Fs.get(spark, url), unique("race")
    writers = 6
    for i in range(writers):
        fs.write(f"{base}/tmp-{i}", f"writer {i}".encode())
    start = threading.Barrier(writers)
    won: dict[int, bool] = {}

    def publish(i: int) -> None:
        start.wait()
        won[i] = fs.rename(f"{base}/tmp-{i}", f"{base}/final")

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [i for i, ok in won.items() if ok]
    assert len(won) == writers and len(winners) == 1, won
    assert fs.read(f"{base}/final") == f"writer {winners[0]}".encode()
    assert fs.names(base) == sorted(["final"] + [f"tmp-{i}" for i in range(writers) if i != winners[0]])


def test_list_and_delete(spark, url: str):
    fs, base = Fs.get(spark, url), unique("delete")
    for name in ("x", "y", "sub/z"):
        fs.write(f"{base}/{name}", name.encode())
    assert fs.names(base) == ["sub", "x", "y"]
    error = java_error(lambda: fs.delete(base, recursive=False))
    assert "is non empty" in error
    assert fs.delete(f"{base}/x", recursive=False) is True
    assert fs.delete(base) is True
    assert not fs.exists(base)
    assert fs.delete(base) is False  # deleting what is not there is not an error


# ---------------------------------------------------------------------------------------------
# (c) Structured Streaming with its checkpoint on HDFS
# ---------------------------------------------------------------------------------------------

ROWS_PER_BATCH = 10


class RateQuery:
    """rate-micro-batch -> foreachBatch: batch k holds exactly the values 10k .. 10k+9.

    Stopping a query interrupts a batch in flight, and if that batch is inside the Python
    foreachBatch, Spark classifies the py4j error by a regex over its text, which can overflow
    the stack (SPARK-39218, SPARK-48717): noise that hides real failures. So a continuous query is
    stopped only between batches, and the rest use Trigger.AvailableNow, which ends by itself
    (on this source: after exactly one batch)."""

    def __init__(self, spark, checkpoint: str):
        self.spark = spark
        self.checkpoint = checkpoint
        self.batches: dict[int, list[int]] = {}
        self.query = None

    def _record(self, frame, batch_id: int) -> None:
        self.batches[batch_id] = sorted(row.value for row in frame.select("value").collect())

    def start(self, **trigger: Any) -> RateQuery:
        source = self.spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
        writer = source.writeStream.foreachBatch(self._record).option("checkpointLocation", self.checkpoint)
        self.query = writer.trigger(**trigger).start()
        return self

    def run_available_now(self, timeout: float = 180.0) -> RateQuery:
        self.start(availableNow=True)
        self.query.awaitTermination(timeout)
        assert not self.query.isActive, f"an availableNow query still runs after {timeout:.0f} s"
        assert self.query.exception() is None, self.query.exception()
        return self

    def await_batches(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.batches) < count:
            if self.query.exception() is not None or not self.query.isActive:
                raise AssertionError(f"the query stopped: {self.query.exception()}")
            assert time.monotonic() < deadline, f"only {len(self.batches)} of {count} batches in {timeout:.0f} s"
            time.sleep(0.05)

    def stop_between_batches(self) -> None:
        """Stop right after a batch committed: the trigger then sleeps until its next interval."""
        self.await_batches(len(self.batches) + 1)
        deadline = time.monotonic() + 30
        while self.query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.02)
        self.query.stop()


def committed_batches(fs: Fs, checkpoint: str) -> list[int]:
    return sorted(int(name) for name in fs.names(f"{checkpoint}/commits") if name.isdigit())


def assert_rate_data(batches: dict[int, list[int]]) -> None:
    for batch_id, values in batches.items():
        assert values == list(range(batch_id * ROWS_PER_BATCH, (batch_id + 1) * ROWS_PER_BATCH)), batch_id


def test_streaming_checkpoint_on_hdfs_resumes_after_a_restart(spark, url: str):
    checkpoint = url + unique("checkpoints") + "/rate"
    fs = Fs.get(spark, url)

    first = RateQuery(spark, checkpoint).start(processingTime="1 second")
    first.await_batches(3)
    first.stop_between_batches()
    committed = committed_batches(fs, checkpoint)
    assert committed == sorted(first.batches)

    second = RateQuery(spark, checkpoint).run_available_now()
    assert list(second.batches) == [committed[-1] + 1], "the restarted query did not resume where it stopped"
    assert_rate_data({**first.batches, **second.batches})
    assert committed_batches(fs, checkpoint) == [*committed, committed[-1] + 1]

    assert {"offsets", "commits", "metadata"} <= set(fs.names(checkpoint))
    leftovers = [n for d in ("offsets", "commits") for n in fs.names(f"{checkpoint}/{d}") if n.endswith(".tmp")]
    assert leftovers == [], "the checkpoint manager left temporary files behind"


def test_eos_keeps_its_metadata_private_and_reset_deletes_only_the_checkpoint_on_hdfs(spark, url: str):
    """A Spark checkpoint on HDFS with eos's metadata: `_eos` 0700 and `pipeline.json` 0600
    (FsPermission; Spark's own files keep HDFS's defaults), nothing in it that eos reset would
    refuse, a file of someone else's refused, and a reset deletes the checkpoint and nothing
    beside it."""
    from eos.errors import CheckpointError
    from eos.protocol.checkpoint import Checkpoint, CheckpointMeta

    parent = url + unique("reset")
    location = f"{parent}/rate"
    RateQuery(spark, location).run_available_now()
    checkpoint = Checkpoint(location, spark)
    checkpoint.write_meta(CheckpointMeta("p", "ck1", "exactly-once", {}, {}, "d"))
    fs = Fs.get(spark, url)

    def mode(path: str) -> int:
        return fs.jfs.getFileStatus(fs.path(path)).getPermission().toShort()

    assert (mode(f"{location}/_eos"), mode(f"{location}/_eos/pipeline.json")) == (0o700, 0o600)
    assert checkpoint.read_meta().checkpoint_id == "ck1"
    checkpoint.check_deletable()
    fs.write(f"{location}/offsets/notes.txt", b"mine")
    with pytest.raises(CheckpointError, match=r"neither Spark nor eos wrote: offsets/notes\.txt"):
        checkpoint.check_deletable()
    fs.delete(f"{location}/offsets/notes.txt")
    fs.write(f"{parent}/beside", b"kept")
    scratch = checkpoint.scratch_dir()  # on this machine, private
    assert scratch.stat().st_mode & 0o777 == 0o700
    assert checkpoint.delete() is True
    assert fs.names(parent) == ["beside"] and not scratch.exists()


# ---------------------------------------------------------------------------------------------
# (d) A NameNode restart while clients write
# ---------------------------------------------------------------------------------------------


class Background(threading.Thread):
    """Run `call` in a thread; keep its error and how long it took."""

    def __init__(self, call: Callable[[], Any]):
        super().__init__(daemon=True)
        self.call = call
        self.error: BaseException | None = None
        self.took: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.call()
        except BaseException as error:
            self.error = error
        self.took = time.monotonic() - started


def test_writes_during_a_namenode_restart(spark, url: str, hdfs: LocalHdfs):
    """Default client: fails at once. With RESTART_TOLERANT_CLIENT: blocks, then succeeds.

    The same holds for a streaming micro-batch whose session carries those settings: started
    while the NameNode is down, it waits for it and then commits to its HDFS checkpoint."""
    base = unique("restart")
    # Hadoop's default spelled out: a session eos built for an hdfs:// checkpoint turns the retry
    # policy on in its Hadoop conf (as when this module runs alone), and Fs.new starts from that.
    default = Fs.new(spark, url, {"dfs.client.retry.policy.enabled": "false"})
    tolerant = Fs.new(spark, url, RESTART_TOLERANT_CLIENT)
    default.write(f"{base}/before", b"before")  # both clients are connected before the NameNode goes
    assert tolerant.read(f"{base}/before") == b"before"

    with session_settings(spark, RESTART_TOLERANT_CLIENT):
        checkpoint = url + base + "/checkpoint"
        RateQuery(spark, checkpoint).run_available_now()  # batch 0, with the NameNode up

        hdfs.kill("namenode")
        started = time.monotonic()
        error = java_error(lambda: default.write(f"{base}/default", b"x"))
        default_failed_after = time.monotonic() - started
        # Which one depends on where the connection was: dropped (EOF, reset) or refused on redial.
        assert re.search(r"EOFException|ConnectException|SocketException", error), error
        assert default_failed_after < 10, "the default client is not expected to retry"

        write = Background(lambda: tolerant.write(f"{base}/tolerant", b"written across the restart"))
        stream = RateQuery(spark, checkpoint)
        batch = Background(stream.run_available_now)
        write.start()
        batch.start()
        time.sleep(1)
        assert write.is_alive(), f"the tolerant write did not wait for the NameNode: {write.error}"
        assert batch.is_alive(), f"the micro-batch did not wait for the NameNode: {batch.error}"

        restart = hdfs.restart_namenode()
        for waiting in (write, batch):
            waiting.join(timeout=180)
            assert not waiting.is_alive() and waiting.error is None, waiting.error
        assert default.read(f"{base}/tolerant") == b"written across the restart"
        assert list(stream.batches) == [1]
        assert_rate_data(stream.batches)
        assert committed_batches(default, checkpoint) == [0, 1]

    # Spark's own cached FileSystem reconnects by itself once the NameNode is back.
    spark.range(10).write.parquet(f"{url}{base}/after")
    assert spark.read.parquet(f"{url}{base}/after").count() == 10
    print(
        f"\nNameNode restart: writable again after {restart.ready_in:.1f} s; default client failed after "
        f"{default_failed_after:.2f} s ({error.split(':')[0]}); tolerant write took {write.took:.1f} s, "
        f"the micro-batch {batch.took:.1f} s"
    )


class session_settings:
    """Set Hadoop keys in the session's SQL conf (they reach every Hadoop conf Spark makes for a
    query, e.g. the checkpoint's), restoring the previous values after."""

    def __init__(self, spark, settings: dict[str, str]):
        self.spark, self.settings = spark, settings
        self.previous: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.settings.items():
            self.previous[key] = self.spark.conf.get(key, None)
            self.spark.conf.set(key, value)

    def __exit__(self, *_: object) -> None:
        for key, value in self.previous.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)


# ---------------------------------------------------------------------------------------------
# Last: the trimmed jar set held up through everything above
# ---------------------------------------------------------------------------------------------


def test_the_daemons_never_missed_a_class(hdfs: LocalHdfs):
    assert missing_classes(hdfs) == []


def test_the_daemons_listen_outside_the_ephemeral_port_range(hdfs: LocalHdfs):
    """A restarted NameNode binds its old port again. Were it an ephemeral port, any outgoing
    connection or bind(0) on the machine could be given it while the NameNode is down."""
    low, high = jvm.ephemeral_range()
    ports = vars(hdfs.ports())
    assert ports and all(not low <= port <= high for port in ports.values()), ((low, high), ports)

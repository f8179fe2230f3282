"""Pipelines whose checkpoint is on S3 (s3a://, through hadoop-aws) on the session's real S3 server
(S3Proxy, tests/support_s3.py): Spark's offset and commit logs and eos's metadata live there, and
the barrier's scratch folder on the driver's machine. Each run is an `eos run` process, as a user
starts it: eos adds the S3A connector to the Spark it starts, and the credentials reach it as
${VAR}s of the pipeline's spark.conf, on no command line and in no log.

Spark runs are few and each proves several things: a kill -9 mid-epoch and its restart (exactly
once, read back by eos verify and by an independent reader), `eos status` and `eos reset` on the
same checkpoint, and a second driver on one S3 checkpoint (refused, then a take-over that fences
the first). The kill -9 pipeline also writes a Delta table on s3:// in the same epochs (delta-rs,
its storage options from the pipeline file, credentials as ${VAR}s), read back by delta-rs's own
reader and by Spark's own Delta reader over s3a://."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from eos.config import load_pipeline
from eos.errors import ConfigError, SlotAborted
from eos.failpoints import release
from eos.pipeline import connectors, pipeline_info
from eos.protocol.checkpoint import scratch_dir
from eos_connectors.delta import sink as delta_sink_module
from eos_connectors.delta import staging
from eos_connectors.delta.sink import DeltaSink
from eos_ops.delta import read_table
from eos_ops.s3 import REGION
from tests.faults.test_fault_matrix import eos_verify
from tests.integration.test_delta_sink import commit_twice_at_once, stage
from tests.integration.test_s3 import commands_holding
from tests.pipelines import (
    ROOT,
    assert_exactly_once,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)
from tests.support import independent_committed_values
from tests.support_delta import spark_delta_reader
from tests.support_s3 import ACCESS_VAR, SECRET_VAR

pytestmark = pytest.mark.slow


class CommandLineWatch(threading.Thread):
    """Scans every process's command line for `secret` until stopped (what `ps` shows anyone)."""

    def __init__(self, secret: str):
        super().__init__(daemon=True)
        self.secret = secret
        self.seen: list[str] = []
        self.scans = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.seen += commands_holding(self.secret)
            self.scans += 1
            self._stopping.wait(0.1)

    def __enter__(self) -> CommandLineWatch:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self.join(timeout=30)


def s3_pipeline(s3, name: str, bootstrap: str, source: str, sink: str, location: str, **options) -> dict:
    config = passthrough_pipeline(name, bootstrap, source, sink, location, **options)  # type: ignore[arg-type]
    config["spark"] = {"conf": s3.spark_conf()}
    return config


def s3_keys(s3, prefix: str) -> list[str]:
    return [key.removeprefix(f"{prefix}/") for key in s3.client().keys(s3.bucket, f"{prefix}/")]


def delta_sink(s3, table: str) -> dict:
    """A Delta sink on s3:// as a user writes it: the store's settings in `storage_options`, the
    credentials as ${VAR}s (the same variables as spark.conf's: nothing named AWS_* is in the
    environment, so delta-rs has only these)."""
    options = {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",  # the local server speaks http://
        "AWS_ACCESS_KEY_ID": f"${{{ACCESS_VAR}}}",
        "AWS_SECRET_ACCESS_KEY": f"${{{SECRET_VAR}}}",
    }
    return {
        "name": "lake",
        "delta": {
            "table": table, "create_table": True, "partition_by": ["p"],
            "columns": {"id": "value", "k": "key", "p": "partition"}, "storage_options": options,
        },
    }  # fmt: skip


def unnamed(s3, prefix: str, table: str) -> dict[str, bytes]:
    """Objects under the table's folder that no version of its log names (its log aside): what
    staged attempts left, with their bytes."""
    logged = {
        uri.removeprefix(f"s3://{s3.bucket}/{prefix}/") for uri in DeltaTable(table, storage_options=s3.env).file_uris()
    }
    keys = [k for k in s3_keys(s3, prefix) if k.startswith("lake/") and not k.startswith("lake/_delta_log/")]
    return {k: s3.client().get(s3.bucket, f"{prefix}/{k}") or b"" for k in keys if k not in logged}


def s3a_settings(s3) -> dict[str, str]:
    """spark_conf()'s Hadoop settings with the credentials filled in (for Spark's Delta reader, on stdin)."""
    values = {f"${{{name}}}": value for name, value in s3.credentials_env().items()}
    return {k.removeprefix("spark.hadoop."): values.get(v, v) for k, v in s3.spark_conf().items()}


def test_a_checkpoint_and_a_delta_table_on_s3_through_kill_9_status_and_reset(
    s3, bootstrap, new_topic, unique_name, tmp_path
):
    """One pipeline writes a topic and a Delta table on s3:// (delta-rs), its checkpoint on s3a://.
    Epoch 0 commits; in epoch 1 the Delta sink's first slot pre-commits (its Parquet files and
    manifest staged in the bucket) and the driver is killed (kill -9, its whole process group): the
    restart replays epoch 1 from the offset log on S3, removes the dead attempt's staged objects and
    commits the epoch once. The topic and the table hold exactly the input, by independent readers
    (delta-rs's and Spark's own Delta reader over s3a://, one Delta version per epoch).

    `eos status` reads the checkpoint on S3 and lists staged Delta files that linger (the dead
    attempt's objects, saved after the crash, are put back as a second crash would leave them);
    `eos reset` deletes what Spark and eos wrote under the checkpoint, and the scratch folder,
    removes the staged objects and nothing else of the table (its rows stay, one version more sets
    its app transaction to -1), and leaves an object beside them. The secret key is on no command
    line while all this runs, in no output, in no log and in no object written to the bucket."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    prefix = s3.prefix("kill")
    location = f"s3a://{s3.bucket}/{prefix}/ck"
    table = f"s3://{s3.bucket}/{prefix}/lake"
    client = s3.client()
    assert client.put(s3.bucket, f"{prefix}/beside", b"not the checkpoint's").status == 200
    name = unique_name("p")
    config = s3_pipeline(s3, name, bootstrap, source, sink, location, max_records_per_epoch=400)
    config["sinks"].append(delta_sink(s3, table))
    path = write_pipeline(tmp_path, config)
    env = s3.credentials_env()
    ambient = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_PROFILE"}
    assert not ambient & set(os.environ), "delta-rs would find credentials in the environment"
    outputs: list[str] = []
    with CommandLineWatch(s3.secret_key) as watch:
        # Slots 0-1 are the topic's, 2-3 the table's (sinks in order): slot 2 has staged its files.
        failpoint = "sink.after_precommit=kill@epoch=1,slot=2"
        crashed = eos_subprocess("run", str(path), "--failpoint", failpoint, env=env)
        outputs.append(crashed.output)
        assert crashed.killed, f"the failpoint did not fire:\n{crashed.output[-3000:]}"
        assert "kill -9 at sink.after_precommit" in crashed.output
        # What the killed driver left on S3: epoch 0 committed, epoch 1 logged, not committed.
        keys = s3_keys(s3, prefix)
        assert {"ck/offsets/0", "ck/commits/0", "ck/offsets/1", "ck/_eos/pipeline.json"} <= set(keys), keys
        assert "ck/commits/1" not in keys
        assert (scratch_dir(location) / "failpoints").is_dir()  # the scratch folder, on this machine
        # ... and in the table's folder: epoch 1's staged attempt of slot 2, named by no version.
        app = f"eos/{name}/lake"
        assert DeltaTable(table, storage_options=s3.env).transaction_version(app) == 0
        dead = unnamed(s3, prefix, table)
        folder = f"lake/{staging.folder(name, 'lake')}/"
        assert [k for k in dead if k.startswith(folder + "e1-a1-s2-") and k.endswith(".json")], sorted(dead)
        assert [k for k in dead if "/eos-e1-a1-s2-" in k and k.endswith(".parquet")], sorted(dead)

        restarted = eos_subprocess("run", str(path), env=env)
        outputs.append(restarted.output)
        assert restarted.returncode == 0, restarted.output[-3000:]
        assert "recover" in restarted.output.lower(), restarted.output[-3000:]
        assert re.search(r"sink lake: committed 0 and removed [1-9]\d* staged attempts", restarted.output), (
            restarted.output[-3000:]
        )
        assert unnamed(s3, prefix, table) == {}, "staged objects outlived the recovery"
        lake = DeltaTable(table, storage_options=s3.env)
        epochs = [c["eos"]["epoch"] for c in reversed(lake.history()) if "eos" in c]
        assert Counter(row["id"] for row in read_table(table, s3.env)) == Counter(sent)
        assert Counter(spark_delta_reader().ids(table.replace("s3://", "s3a://", 1), hadoop=s3a_settings(s3))) == (
            Counter(sent)
        )

        for key, data in dead.items():  # as a second crash would leave them
            assert client.put(s3.bucket, f"{prefix}/{key}", data).status == 200
        status = eos_subprocess("status", str(path), "--json", env=env, timeout=180)
        outputs.append(status.output)
        report = json.loads(status.output[status.output.index("{") :])
        logs = [key.split("/")[1:] for key in s3_keys(s3, prefix) if key.startswith(("ck/commits/", "ck/offsets/"))]
        committed = max(int(n) for log, n in logs if log == "commits" and n.isdigit())
        assert report["checkpoint"]["last_committed_epoch"] == committed >= 1, report["checkpoint"]
        assert report["checkpoint"]["last_logged_epoch"] == committed
        lingering = next(row for row in report["lingering"] if row["sink"] == "lake")
        assert [line for line in lingering["open"] if line.startswith("e1-a1-s2-")], lingering
        assert lake.transaction_version(app) == committed
        assert epochs == list(range(committed + 1)), epochs  # one version per epoch, none twice

        table_before = {k for k in s3_keys(s3, prefix) if k.startswith("lake/")} - set(dead)
        written = b"".join(client.get(s3.bucket, f"{prefix}/{key}") or b"" for key in s3_keys(s3, prefix))
        reset = eos_subprocess("reset", str(path), "--yes", env=env, timeout=180)
        outputs.append(reset.output)
        assert reset.returncode == 0, reset.output[-3000:]
    assert watch.scans > 10 and watch.seen == [], watch.seen

    verified = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert verified["ok"] and (verified["lost"], verified["duplicated"]) == (0, 0), verified
    assert sorted(independent_committed_values(bootstrap, sink)) == sorted(sent)

    assert f"deleted checkpoint {location}" in reset.output, reset.output[-3000:]
    assert not scratch_dir(location).exists()
    # The table: the staged objects are gone, nothing else is, and one version was added.
    remaining = s3_keys(s3, prefix)
    table_after = {k for k in remaining if k.startswith("lake/")}
    assert sorted(set(remaining) - table_after) == ["beside"]
    assert table_before <= table_after and not set(dead) & table_after, sorted(table_after ^ table_before)
    added = table_after - table_before
    assert len(added) == 1 and next(iter(added)).startswith("lake/_delta_log/"), added
    assert DeltaTable(table, storage_options=s3.env).transaction_version(app) == -1
    assert Counter(row["id"] for row in read_table(table, s3.env)) == Counter(sent)  # the rows stay

    secret = s3.secret_key
    written += b"".join(client.get(s3.bucket, f"{prefix}/{key}") or b"" for key in added)
    assert written and secret.encode() not in written, "an object in the bucket holds the secret key"
    assert not [i for i, output in enumerate(outputs) if secret in output], "an eos command printed the secret key"
    assert secret not in s3.server.log_file.read_text(errors="replace")
    assert s3.missing_classes() == []


def test_a_second_driver_on_one_s3_checkpoint_is_refused_and_a_takeover_fences_the_first(
    s3, bootstrap, new_topic, unique_name, tmp_path
):
    """As tests/faults/test_guards.py does on a local checkpoint: driver B commits epoch 0 to its
    checkpoint on S3, logs epoch 1 and stalls. A second driver is refused while B answers (S3
    itself has no lock, nor an atomic rename: Kafka's fencing keeps the one writer). Driver A
    takes over, fences B, replays epoch 1 and finishes; B wakes up, cannot commit epoch 1, stops
    with a clear error, and nothing it wrote becomes visible."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    prefix = s3.prefix("drivers")
    location = f"s3a://{s3.bucket}/{prefix}/ck"
    config = s3_pipeline(s3, unique_name("p"), bootstrap, source, sink, location, max_records_per_epoch=300)
    path = write_pipeline(tmp_path, config)
    env = s3.credentials_env()
    stalled = subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path), "--failpoint", "epoch.after_offsets_logged=pause(900)@epoch=1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
        env={**os.environ, **env},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "ck/commits/0" not in s3_keys(s3, prefix):
            assert stalled.poll() is None, f"driver B ended first:\n{stalled.stdout.read()[-3000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "driver B never committed epoch 0"
            time.sleep(0.5)
        time.sleep(2)  # B is now inside epoch 1's pause

        refused = eos_subprocess("run", str(path), env=env)
        assert refused.returncode != 0
        assert "another eos driver is running this pipeline" in refused.output, refused.output[-3000:]

        took_over = eos_subprocess("run", str(path), "--take-over", env=env)
        assert took_over.returncode == 0, took_over.output[-3000:]
        assert_exactly_once(sent, committed_values(bootstrap, sink))
        assert stalled.poll() is None, "driver B was meant to stall until now"

        release(scratch_dir(location) / "failpoints")  # B wakes up with its stale view
        output, _ = stalled.communicate(timeout=300)
        assert stalled.returncode != 0, output[-3000:]
        assert "another eos driver took over pipeline" in output, output[-3000:]
        assert "epoch 1 attempt 1 ABORTED" in output, output[-3000:]
    finally:
        if stalled.poll() is None:
            stalled.kill()
    assert_exactly_once(sent, committed_values(bootstrap, sink))  # B's late epoch 1 never committed
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert report["ok"], report


def test_on_s3_a_concurrent_writer_of_the_app_id_cannot_make_eos_commit_twice(s3, unique_name, tmp_path, monkeypatch):
    """tests/integration/test_delta_sink.py's concurrent writers, on a table on s3:// (no Spark:
    the sink's own commit path, its storage options read from a pipeline file). Both rest on the
    store's conditional PUT: two writers of one log version, one gets 412 and delta-rs then checks
    the winner for a conflicting app transaction. Another writer commits eos's app id and epoch
    between eos's check and its commit: eos's commit is refused, its rows are not added. Two
    commits of the same staged epoch at once: one version adds the rows, the other finds them.
    And a pipeline that switches conditional PUT off is refused up front."""
    table = f"s3://{s3.bucket}/{s3.prefix('concurrent')}/lake"
    entry = delta_sink(s3, table)
    entry["delta"] = {"table": table, "storage_options": entry["delta"]["storage_options"]}
    # No broker: nothing here reads the source or the control log.
    config = passthrough_pipeline(unique_name("p"), "127.0.0.1:1", "in", "unused", tmp_path / "ck")  # type: ignore[arg-type]
    config["sinks"] = [entry]
    for name, value in s3.credentials_env().items():
        monkeypatch.setenv(name, value)
    loaded = load_pipeline(write_pipeline(tmp_path, config))
    sink = connectors(loaded, pipeline_info(loaded, "ck0", tmp_path)).sinks[0]
    assert isinstance(sink, DeltaSink)
    schema = pa.schema(
        [("id", pa.string()), ("k", pa.string()), ("src_partition", pa.int32()), ("src_offset", pa.int64())]
    )
    DeltaTable.create(table, schema, storage_options=s3.env)
    sink._prepare_table(schema)

    def ids() -> list[str]:
        return sorted(str(row["id"]) for row in read_table(table, s3.env))

    prepared = [stage(sink, schema, 3, 0, ["a", "b"]), stage(sink, schema, 3, 1, ["c"])]

    def zombie(_: DeltaTable) -> None:  # commits app id @ epoch 3 right after eos's check
        monkeypatch.setattr(delta_sink_module, "_between_check_and_commit", lambda _: None)
        write_deltalake(
            table, pa.table({"id": ["z"]}), mode="append", schema_mode="merge", storage_options=s3.env,
            commit_properties=CommitProperties(app_transactions=[Transaction(sink.app_id, 3)]),
        )  # fmt: skip

    monkeypatch.setattr(delta_sink_module, "_between_check_and_commit", zombie)
    with pytest.raises(SlotAborted, match="another writer committed"):
        sink.commit(prepared)
    assert ids() == ["z"]

    again = [stage(sink, schema, 4, 0, ["d"]), stage(sink, schema, 4, 1, ["e", "f"])]
    assert commit_twice_at_once(sink, again, monkeypatch) == []
    assert ids() == ["d", "e", "f", "z"]
    history = DeltaTable(table, storage_options=s3.env).history()
    assert sum(1 for c in history if c.get("eos", {}).get("epoch") == 4) == 1

    entry["delta"]["storage_options"]["AWS_CONDITIONAL_PUT"] = "disabled"
    with pytest.raises(
        ConfigError, match="AWS_CONDITIONAL_PUT: disabled: delta-rs commits a version with a conditional"
    ):
        load_pipeline(write_pipeline(tmp_path, config))

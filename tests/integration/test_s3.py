"""The local S3 server the S3 tests share (S3Proxy, eos_ops.s3), checked without Spark: it is
private (signed requests only, with its own credentials, which no command line shows), and it
honours what a Delta table's concurrent writers rely on, the conditional PUT. And a Spark that
eos did not start, without the S3A connector, is told so. (Pipelines on S3:
tests/faults/test_s3_faults.py.)"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from eos.errors import CheckpointError
from eos.protocol.checkpoint import Checkpoint
from eos_ops import jvm
from eos_ops.s3 import Credentials, S3Client
from tests.pipelines import eos_subprocess, passthrough_pipeline, write_pipeline


def test_only_signed_requests_with_the_servers_own_keys_get_in(s3):
    client, key = s3.client(), f"{s3.prefix('private')}/object"
    assert client.put(s3.bucket, key, b"payload").status == 200
    wrong = S3Client(s3.endpoint, Credentials(s3.server.credentials().access_key, "not-the-secret"))
    for path in (f"/{s3.bucket}", f"/{s3.bucket}/{key}"):
        assert client.request("GET", path).status == 200
        assert client.request("GET", path, signed=False).status == 403, f"{path} is readable anonymously"
        assert wrong.request("GET", path).status == 403, f"{path} is readable with a wrong secret"
    # A bucket or object others could read on disk would be public-read to S3Proxy: none is.
    for path in [s3.server.blobs_dir, *s3.server.blobs_dir.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is open to other users"


def test_the_credentials_are_in_private_files_and_on_no_command_line(s3):
    for path in (s3.server.properties_file, s3.server.env_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert s3.secret_key in path.read_text()
    assert stat.S_IMODE(s3.server.conf_dir.stat().st_mode) == 0o700
    pid = s3.server.pid()
    assert pid is not None
    assert str(s3.server.properties_file).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert commands_holding(s3.secret_key) == []
    assert s3.secret_key not in s3.server.log_file.read_text(errors="replace")


def test_conditional_puts_are_honoured(s3):
    """delta-rs commits a table version by creating `_delta_log/N.json` only if it does not exist
    (If-None-Match: *): two writers of the same version, one wins. S3Proxy's filesystem backend
    answers the loser 412, as S3 does; and If-Match on a stale ETag too."""
    client, key = s3.client(), f"{s3.prefix('conditional')}/_delta_log/00000000000000000000.json"
    first = client.put(s3.bucket, key, b"writer 1", {"If-None-Match": "*"})
    second = client.put(s3.bucket, key, b"writer 2", {"If-None-Match": "*"})
    assert (first.status, second.status) == (200, 412), second.body[:300]
    assert b"PreconditionFailed" in second.body
    assert client.get(s3.bucket, key) == b"writer 1"

    etag = first.headers["etag"]
    assert client.put(s3.bucket, key, b"replaced", {"If-Match": etag}).status == 200
    assert client.put(s3.bucket, key, b"stale", {"If-Match": etag}).status == 412
    assert client.get(s3.bucket, key) == b"replaced"


def test_the_server_listens_on_loopback_outside_the_ephemeral_range_and_misses_no_class(s3):
    port = int(s3.endpoint.rsplit(":", 1)[1])
    assert s3.endpoint.startswith("http://127.0.0.1:")
    low, high = jvm.ephemeral_range()
    assert not low <= port <= high
    assert s3.missing_classes() == []


def test_eos_s3_status_names_the_running_server_and_where_its_credentials_are(s3):
    running = eos_subprocess("s3", "status", "--data-dir", str(s3.server.data_dir), timeout=60)
    assert running.returncode == 0, running.output
    assert f"running at {s3.endpoint}" in running.output and str(s3.server.env_file) in running.output
    assert s3.secret_key not in running.output
    stopped = eos_subprocess("s3", "status", "--data-dir", str(s3.server.data_dir / "none"), timeout=60)
    assert stopped.returncode == 3 and "not running" in stopped.output


def test_a_spark_without_the_s3a_connector_is_told_what_it_lacks(spark):
    """The suite's session was started for local checkpoints, as a user's own SparkSession might be:
    eos cannot add jars to a JVM that runs already, and says what is missing instead of Hadoop's
    bare ClassNotFoundException."""
    with pytest.raises(CheckpointError, match=r"no Hadoop connector for s3a://.*S3AFileSystem not found") as error:
        Checkpoint("s3a://bucket/pipelines/ck", spark)
    assert "hadoop-aws" in (error.value.hint or "")


def test_eos_reset_on_s3_refuses_a_bucket_root_and_a_folder_holding_what_eos_did_not_write(s3, tmp_path):
    """`eos reset` reads the checkpoint through the pipeline's s3a settings (endpoint, credentials
    as ${VAR}s) and the connector eos adds, and deletes only what Spark and eos write: a bucket's
    root is refused before anything starts, and so is a checkpoint folder with a stranger's object
    in it (which stays)."""
    prefix = s3.prefix("reset")
    env = s3.credentials_env()
    for location, refusal in [
        (f"s3a://{s3.bucket}/", rf"{s3.bucket}/ is the root of the filesystem s3a://{s3.bucket}"),
        (f"s3a://{s3.bucket}/{prefix}/ck", r"neither Spark nor eos wrote: offsets/notes\.txt"),
    ]:
        config = passthrough_pipeline("reset-on-s3", "127.0.0.1:1", "in", "out", location)  # type: ignore[arg-type]
        config["spark"] = {"conf": s3.spark_conf()}
        s3.client().put(s3.bucket, f"{prefix}/ck/offsets/notes.txt", b"a stranger's")
        refused = eos_subprocess("reset", str(write_pipeline(tmp_path, config)), "--yes", env=env, timeout=180)
        assert refused.returncode != 0 and re.search(refusal, refused.output), refused.output[-3000:]
        assert "Traceback" not in refused.output
    assert s3.client().keys(s3.bucket, f"{prefix}/") == [f"{prefix}/ck/offsets/notes.txt"]


def commands_holding(secret: str) -> list[str]:
    """The command lines of this machine's processes that hold `secret` (/proc/*/cmdline)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        if secret.encode() in text:
            shown = text.replace(b"\0", b" ").decode(errors="replace")[:300]
            found.append(f"{cmdline.parent.name}: {shown}")
    return found

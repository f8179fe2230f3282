"""Pipelines whose checkpoint is on S3 (s3a://, through hadoop-aws) on the session's real S3 server
(S3Proxy, tests/support_s3.py): Spark's offset and commit logs and eos's metadata live there, and
the barrier's scratch folder on the driver's machine. Each run is an `eos run` process, as a user
starts it: eos adds the S3A connector to the Spark it starts, and the credentials reach it as
${VAR}s of the pipeline's spark.conf, on no command line and in no log.

Spark runs are few and each proves several things: a kill -9 mid-epoch and its restart (exactly
once, read back by eos verify and by an independent reader), `eos status` and `eos reset` on the
same checkpoint, and a second driver on one S3 checkpoint (refused, then a take-over that fences
the first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from eos.failpoints import release
from eos.protocol.checkpoint import scratch_dir
from tests.faults.test_fault_matrix import eos_verify
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


def test_a_checkpoint_on_s3_through_kill_9_status_and_reset(s3, bootstrap, new_topic, unique_name, tmp_path):
    """Epoch 0 commits, epoch 1 is pre-committed and the driver is killed (kill -9, its whole
    process group): the restart replays epoch 1 from the offset log on S3 and the output is
    exactly the input. `eos status` reads the checkpoint on S3; `eos reset` deletes what Spark
    and eos wrote there, and the scratch folder, and leaves an object beside it. The secret key
    is on no command line while all this runs, in no output, in no log and in no checkpoint file."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    prefix = s3.prefix("kill")
    location = f"s3a://{s3.bucket}/{prefix}/ck"
    client = s3.client()
    assert client.put(s3.bucket, f"{prefix}/beside", b"not the checkpoint's").status == 200
    config = s3_pipeline(s3, unique_name("p"), bootstrap, source, sink, location, max_records_per_epoch=400)
    path = write_pipeline(tmp_path, config)
    env = s3.credentials_env()
    outputs: list[str] = []
    with CommandLineWatch(s3.secret_key) as watch:
        crashed = eos_subprocess("run", str(path), "--failpoint", "sink.after_precommit=kill@epoch=1", env=env)
        outputs.append(crashed.output)
        assert crashed.killed, f"the failpoint did not fire:\n{crashed.output[-3000:]}"
        assert "kill -9 at sink.after_precommit" in crashed.output
        # What the killed driver left on S3: epoch 0 committed, epoch 1 logged, not committed.
        keys = s3_keys(s3, prefix)
        assert {"ck/offsets/0", "ck/commits/0", "ck/offsets/1", "ck/_eos/pipeline.json"} <= set(keys), keys
        assert "ck/commits/1" not in keys
        assert (scratch_dir(location) / "failpoints").is_dir()  # the scratch folder, on this machine

        restarted = eos_subprocess("run", str(path), env=env)
        outputs.append(restarted.output)
        assert restarted.returncode == 0, restarted.output[-3000:]
        assert "recover" in restarted.output.lower(), restarted.output[-3000:]

        status = eos_subprocess("status", str(path), "--json", env=env, timeout=180)
        outputs.append(status.output)
        report = json.loads(status.output[status.output.index("{") :])
        logs = [key.split("/")[1:] for key in s3_keys(s3, prefix) if key.startswith(("ck/commits/", "ck/offsets/"))]
        committed = max(int(name) for log, name in logs if log == "commits" and name.isdigit())
        assert report["checkpoint"]["last_committed_epoch"] == committed >= 1, report["checkpoint"]
        assert report["checkpoint"]["last_logged_epoch"] == committed

        written = b"".join(client.get(s3.bucket, f"{prefix}/{key}") or b"" for key in s3_keys(s3, prefix))
        reset = eos_subprocess("reset", str(path), "--yes", env=env, timeout=180)
        outputs.append(reset.output)
        assert reset.returncode == 0, reset.output[-3000:]
    assert watch.scans > 10 and watch.seen == [], watch.seen

    verified = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert verified["ok"] and (verified["lost"], verified["duplicated"]) == (0, 0), verified
    assert sorted(independent_committed_values(bootstrap, sink)) == sorted(sent)

    assert f"deleted checkpoint {location}" in reset.output, reset.output[-3000:]
    assert s3_keys(s3, prefix) == ["beside"]
    assert not scratch_dir(location).exists()

    secret = s3.secret_key
    assert written and secret.encode() not in written, "a checkpoint file holds the secret key"
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

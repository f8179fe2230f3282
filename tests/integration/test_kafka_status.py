"""`eos kafka status` finds the broker eos started, whatever its port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import KafkaUnderTest, start_local_broker


def kafka_status(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EOS_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "eos", "kafka", "status", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_status_finds_a_broker_on_any_port(kafka: KafkaUnderTest, tmp_path):
    """The session's local broker runs on a free port, not 9092: put it where `eos kafka start
    --port N` keeps its data ($EOS_HOME/broker-N; a symlink, the broker runs on) and ask without
    --port. (With another kind of broker under test, this test starts a local one.)"""
    broker = getattr(kafka, "broker", None)
    own = None
    if broker is None:
        own = start_local_broker(tmp_path / "own")
        broker = own.broker  # type: ignore[attr-defined]
    try:
        assert broker.port != 9092
        home = tmp_path / "home"
        home.mkdir()
        (home / f"broker-{broker.port}").symlink_to(broker.data_dir, target_is_directory=True)
        found = kafka_status(home)
        assert found.returncode == 0, found.stdout + found.stderr
        expected = f"running at 127.0.0.1:{broker.port}, pid {broker.pid()}, answering"
        assert found.stdout.startswith(expected), found.stdout
        # Asked for the default port, it says that one is not running.
        default = kafka_status(home, "--port", "9092")
        assert default.returncode == 3 and default.stdout.startswith("not running (data directory "), default.stdout
    finally:
        if own is not None:
            own.close()
    nothing = kafka_status(tmp_path / "empty")
    assert nothing.returncode == 3
    expected = f"not running: no local Kafka broker or cluster of eos runs under {tmp_path / 'empty'}"
    assert nothing.stdout.startswith(expected), nothing.stdout

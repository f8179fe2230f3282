"""A source's scans take each epoch's ends from one another through files (eos.protocol.barrier);
a scan checks ends it reads back before it uses them (issue 35, scratch space): every partition of
the start has an end, and start <= end <= the log's latest offset. Ends planted below the start
(a re-read: duplicates) or beyond the log's end are refused. A real broker and topic; the ends
are planted where the other scan would have published them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from eos.errors import SourceFailed, TaskError, from_spark
from eos.protocol.barrier import SharedEnds
from eos_connectors.kafka.reader import KafkaStreamReader, ReaderOptions
from tests.pipelines import produce_numbered


def scan(bootstrap: str, topic: str, folder: Path) -> KafkaStreamReader:
    options = ReaderOptions(
        name="events", client={"bootstrap.servers": bootstrap}, topics=[topic], starting={}, topic_ids={},
        parallelism=1, on_error="fail", shared_ends=SharedEnds(str(folder), "run1"),
    )  # fmt: skip
    return KafkaStreamReader(options)


def plant(folder: Path, start: dict, ends: dict) -> None:
    """Ends for this scan's first round from `start`, where another scan would publish them."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = json.dumps(["run1", 1, start], sort_keys=True)
    (folder / hashlib.sha256(key.encode()).hexdigest()[:32]).write_text(json.dumps(ends))


@pytest.fixture
def topic(bootstrap, new_topic) -> str:
    name = new_topic(partitions=2)
    produce_numbered(bootstrap, name, 0, 40)
    return name


def latest(bootstrap: str, topic: str, tmp_path: Path) -> dict:
    return scan(bootstrap, topic, tmp_path / "own").latestOffset({topic: {"0": 0, "1": 0}}, ReadAllAvailable())


def test_ends_another_scan_published_are_taken_when_they_can_be_right(bootstrap, topic, tmp_path):
    ends = latest(bootstrap, topic, tmp_path)
    start = {topic: {"0": 5, "1": 5}}
    plant(tmp_path / "shared", start, ends)
    assert scan(bootstrap, topic, tmp_path / "shared").latestOffset(start, ReadAllAvailable()) == ends


@pytest.mark.parametrize("wrong", ["below the start", "beyond the latest offset", "a partition missing"])
def test_ends_that_cannot_be_right_are_refused(bootstrap, topic, tmp_path, wrong: str):
    ends = latest(bootstrap, topic, tmp_path)
    start = {topic: {"0": 5, "1": 5}}
    planted = {
        "below the start": {topic: {"0": 0, "1": ends[topic]["1"]}},
        "beyond the latest offset": {topic: {"0": ends[topic]["0"] + 1000, "1": ends[topic]["1"]}},
        "a partition missing": {topic: {"0": ends[topic]["0"]}},
    }[wrong]
    plant(tmp_path / "shared", start, planted)
    with pytest.raises(TaskError) as refused:  # how it leaves the planning process for the driver
        scan(bootstrap, topic, tmp_path / "shared").latestOffset(start, ReadAllAvailable())
    error = from_spark(refused.value)
    assert isinstance(error, SourceFailed), error  # permanent: the pipeline stops
    assert "cannot be right" in error.message and "refusing them rather than read records twice" in error.message

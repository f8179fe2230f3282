"""SparkProgressBridge.catch_up at the end of a run: Spark's listener bus delivers progress
asynchronously, so the last batches' events may arrive after the query ended, or never."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

from eos.observe.progress import SparkProgressBridge


def _progress(batch: int) -> dict:
    return {"runId": "r1", "batchId": batch, "numInputRows": batch}


class _Query:
    """A query's Java side as the bridge reads it: recentProgress() -> objects with json()."""

    def __init__(self, batches: list[int]):
        recent = [SimpleNamespace(json=lambda b=b: json.dumps(_progress(b))) for b in batches]
        self._jsq = SimpleNamespace(recentProgress=lambda: recent)


class _Seen:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def on_spark_progress(self, progress: dict) -> None:
        self.batches.append(progress["batchId"])


def test_a_late_bus_event_is_waited_for_and_delivered_once():
    seen = _Seen()
    bridge = SparkProgressBridge([seen])
    bridge.deliver(_progress(0))
    late = threading.Timer(0.3, bridge.deliver, args=(_progress(1),))
    late.start()
    started = time.monotonic()
    fed = bridge.catch_up(_Query([0, 1]), wait_s=5.0)
    waited = time.monotonic() - started
    late.join()
    assert fed == 0  # the bus delivered it, not catch_up
    assert seen.batches == [0, 1]
    assert 0.25 < waited < 4.0  # it waited for the event, and stopped waiting when it came


def test_events_the_bus_never_delivers_are_fed_from_the_querys_progress():
    seen = _Seen()
    bridge = SparkProgressBridge([seen])
    bridge.deliver(_progress(0))
    fed = bridge.catch_up(_Query([0, 1, 2]), wait_s=0.2)
    bridge.deliver(_progress(2))  # a bus event after the catch-up is not delivered twice
    assert fed == 2
    assert seen.batches == [0, 1, 2]

"""A source's progress in a consumer group, for lag monitors only: eos never reads it back
(recovery starts from the checkpoint's offset log).

Spark tells a source that an epoch is committed while it plans the next epoch, on the thread
that runs the query. A synchronous group commit there made every next epoch wait for it: the
first one (a consumer, the group's coordinator, the commit) took 62-81 ms on the second epoch's
plan, later ones 2-7 ms, and with the group's coordinator unreachable one commit held the plan for
45 s (librdkafka waits for a coordinator). `GroupPublisher` commits on a thread of its own
instead. Only the newest ends are committed: an epoch's ends cover everything an earlier
epoch's did, so a commit that is overtaken is not needed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from eos_connectors.kafka.clients import consumer
from eos_connectors.kafka.offsets import Offsets

log = logging.getLogger("eos.source")


def commit_group(group: Any, ends: Offsets) -> None:
    """Commit `ends` ({(topic, partition): next offset}) for `group`, a consumer, and wait."""
    from confluent_kafka import TopicPartition

    offsets = [TopicPartition(topic, partition, offset) for (topic, partition), offset in ends.items()]
    if offsets:
        group.commit(offsets=offsets, asynchronous=False)


class GroupPublisher:
    """Commits the newest end offsets handed to `publish` to one consumer group, off the caller's
    thread. Failures are logged, never raised: monitoring must not stop the pipeline."""

    def __init__(self, client: dict[str, Any], group: str, source: str):
        self._client, self._group, self._source = client, group, source
        self._pending: Offsets | None = None
        self._closing = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def publish(self, ends: Offsets) -> None:
        with self._wake:
            self._pending = ends
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"eos-group-{self._group}", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self, wait_s: float = 2.0) -> None:
        """Commit what is still pending, waiting at most `wait_s` for it."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(wait_s)

    def _run(self) -> None:
        group = None
        try:
            while True:
                with self._wake:
                    while self._pending is None and not self._closing:
                        self._wake.wait()
                    ends, self._pending = self._pending, None
                if ends is None:  # closing, nothing left to commit
                    return
                try:
                    group = group or consumer(self._client, **{"group.id": self._group})
                    commit_group(group, ends)
                except Exception as exc:
                    log.warning("source %s: could not commit offsets to group %s: %s", self._source, self._group, exc)
        finally:
            if group is not None:
                group.close()

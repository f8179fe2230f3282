"""The benchmark's pipelines as a Quix Streams application, exactly-once: the peer baseline a Python
team would write instead of eos.

Run by bench/peers (`run_quix`) in its own virtualenv, so this file imports only Quix Streams,
fastavro and confluent-kafka, never eos or bench (see bench/peers for why a separate virtualenv).

- stateless: Avro AdEvent (schemas/ad_event.avsc) -> drop heartbeats and campaign-00 -> AdView
  (bench/schemas/ad_view.avsc: event_id, campaign_id, event_type as a string, event_time) -> the
  output topic, keyed by event_id.
- stateful: the demo (examples/ad_attribution.yaml): drop a repeated event_id while it is within
  the watermark, count impressions and clicks per campaign per event-time minute, emit each window
  once when it closes; see `stateful` for how close Quix's windows come to Spark's watermark.

Avro: Quix's own AvroSerializer/AvroDeserializer without a Schema Registry, which are fastavro's
schemaless writer and reader: the input is plain schemaless Avro, so this reads it as it is written.
timestamp-millis becomes a datetime and back, as Spark makes it a TIMESTAMP.

It stops by itself: the input's end offsets (read_committed) are given (or taken at start); a
process stops (Application.stop(), which commits the open checkpoint, i.e. the transaction) once
every input partition assigned to it is either processed up to its end here or committed up to its
end by the consumer group. So one process stops right after its last record; with several, each
stops once its own share is done, and the last one finds the others' partitions committed. The
stateful pipeline stops on its output count instead (see `stateful`). A JSON summary (counts, times,
this process's CPU at its first record and at the stop) goes to --result.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

MINUTE_MS = 60_000
WATERMARK_DELAY_MS = 60_000


def parse_ends(text: str | None) -> dict[int, int] | None:
    """'0:120,1:98' -> {0: 120, 1: 98}."""
    if not text:
        return None
    return {int(p): int(o) for p, o in (item.split(":") for item in text.split(","))}


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The input's read_committed end offsets, per partition, now."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
    return {tp.partition: future.result().offset for tp, future in futures.items()}


class StopWhenDone:
    """Decides when this process has nothing left to do and stops the Application.

    Offsets processed here come from Quix's on_message_processed callback (main thread); the
    committed offsets of partitions other processes worked on come from the consumer group (an
    AdminClient in a watcher thread: a partition that was revoked from this process, or assigned to
    it already finished, sees no message here)."""

    def __init__(self, bootstrap: str, group: str, topic: str, ends: dict[int, int], expected_out: int = 0) -> None:
        from confluent_kafka.admin import AdminClient

        self.group, self.topic, self.ends = group, topic, ends
        self.expected_out = expected_out  # >0: stop on the output count instead (stateful)
        self.idle_s = 0.0  # with expected_out: also stop after the input's end and this long without a record
        self.last_activity = time.monotonic()
        self.processed: dict[int, int] = {}
        self.records_in = 0
        self.records_out = 0  # stateful: windows out so far
        self.first_record_at: float | None = None
        self.done_at: float | None = None
        self.cpu_at_first_record: float | None = None  # this process's CPU seconds (all threads)
        self.cpu_at_done: float | None = None
        self.app: Any = None
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._stopping = threading.Event()
        self.finished = threading.Event()  # set by main() once Application.run() has returned
        self._lock = threading.Lock()

    def on_processed(self, topic: str, partition: int, offset: int) -> None:
        self.last_activity = time.monotonic()
        if topic != self.topic:
            return
        if self.first_record_at is None:
            self.first_record_at = time.time()
            self.cpu_at_first_record = time.process_time()
        self.records_in += 1
        self.processed[partition] = offset + 1
        if not self.expected_out and offset + 1 >= self.ends.get(partition, 0) and self._assigned_done(committed={}):
            self.stop()

    def watch(self) -> None:
        """Every 100 ms until Application.run() has returned: stop if every assigned partition is
        finished here or committed by the group (with expected_out: if the input is processed and
        nothing has come for idle_s). A process that stops before it has had a record repeats
        Application.stop(): a stop that comes before run() has started its loop is undone by run(),
        which resets its run tracker (a process whose partitions another one finished first)."""
        while not self.finished.wait(0.1):
            if self._stopping.is_set():
                if self.first_record_at is None:
                    self.app.stop()
                continue
            try:
                if self.expected_out:
                    ended = all(self.processed.get(p, 0) >= end for p, end in self.ends.items())
                    if ended and time.monotonic() - self.last_activity > self.idle_s:
                        logging.getLogger("quix_app").warning(
                            "stopping after %.0f s without a record: %s of %s windows out",
                            self.idle_s,
                            self.records_out,
                            self.expected_out,
                        )
                        self.stop()
                elif self._assigned_done(self._committed()):
                    self.stop()
            except Exception as exc:  # a slow broker answer: try again next tick
                logging.getLogger("quix_app").debug("watch: %s", exc)

    def _assigned_done(self, committed: dict[int, int]) -> bool:
        if self.app is None:
            return False
        if all(end == 0 or committed.get(p, -1) >= end for p, end in self.ends.items()):
            return True  # everything committed (also for a process that was assigned nothing)
        assigned = self._assigned()
        if not assigned:
            return False
        return all(max(self.processed.get(p, 0), committed.get(p, -1)) >= self.ends.get(p, 0) for p in assigned)

    def _assigned(self) -> list[int] | None:
        """This process's input partitions, from Quix's (private) confluent-kafka consumer: the
        assignment is what tells "my share". Asked only once the consumer has delivered a record
        (Quix creates it lazily, and a second thread must not race it there) and never after
        stop() (which holds the same lock: the main thread closes the consumer right after)."""
        with self._lock:
            if self.first_record_at is None or self._stopping.is_set():
                return None
            return [tp.partition for tp in self.app._consumer.assignment() if tp.topic == self.topic]

    def _committed(self) -> dict[int, int]:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        request = ConsumerGroupTopicPartitions(self.group, [TopicPartition(self.topic, p) for p in self.ends])
        result = self._admin.list_consumer_group_offsets([request])[self.group].result(timeout=10)
        return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}

    def stop(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
        self.done_at = time.time()
        self.cpu_at_done = time.process_time()
        self.app.stop()


def stateless(
    app: Any, input_topic: str, output_topic: str, event_schema: dict, view_schema: dict, stopper: StopWhenDone
) -> dict[str, int]:
    from quixstreams.models.serializers.avro import AvroDeserializer, AvroSerializer

    counts = {"out": 0}
    events = app.topic(input_topic, key_deserializer="str", value_deserializer=AvroDeserializer(schema=event_schema))
    views = app.topic(output_topic, key_serializer="str", value_serializer=AvroSerializer(schema=view_schema))

    def project(event: dict[str, Any]) -> dict[str, Any]:
        counts["out"] += 1
        return {
            "event_id": event["event_id"],
            "campaign_id": event["campaign_id"],
            "event_type": event["event_type"],
            "event_time": event["event_time"],
        }

    sdf = app.dataframe(events)
    sdf = sdf.filter(lambda e: e["event_type"] != "heartbeat" and e["campaign_id"] != "campaign-00")
    sdf = sdf.apply(project)
    sdf.to_topic(views, key=lambda view: view["event_id"])
    return counts


def stateful(
    app: Any, input_topic: str, output_topic: str, event_schema: dict, counts_schema: dict, stopper: StopWhenDone
) -> dict[str, int]:
    """The demo's aggregation in Quix's terms, as close as its API allows:

    - event time: a timestamp_extractor returns event_time (ms), as the pipeline's watermark column;
    - dedup: a stateful step on the input (keyed by event_id, so a duplicate lands in the same
      partition and key state) drops an event whose event_id it has seen, and one older than the
      watermark (the largest event time of its input partition - 1 minute). The seen mark is written
      with an event-time TTL of the watermark delay, so Quix drops it as Spark's
      dropDuplicatesWithinWatermark drops its state. The per-partition largest event time lives in
      the process (Quix state is per key), not in a changelog: it is rebuilt from the input after a
      restart, where Spark restores its watermark from the checkpoint;
    - counting: group_by(campaign_id) (a repartition topic, JSON values as Quix's default), a
      1-minute tumbling window with a 1-minute grace reduced to [impressions, clicks], emitted with
      .final(closing_strategy="partition"): a window closes when its partition's event time passes
      its end + grace, which is Spark's rule with a watermark per partition instead of one per query;
    - the heartbeat closes the last windows: the dedup step turns it into one heartbeat per campaign
      its partition has seen, so it reaches every partition of the repartition topic that holds a
      campaign; the reducer does not count heartbeats and windows with nothing counted are not output;
    - stopping: the repartition topic is read_committed like any input, so the end of the input does
      not tell when the counts are out; the runner passes the number of windows to expect
      (--expected-out) and the app stops once it has produced them (Application.stop() commits).
      Should fewer come out (events dropped as late, see bench/peers), it stops once the input is
      processed and no record has come for two commit intervals + 5 s, and says so in its log;
    - the repartition topic and the output get the wall-clock time as record timestamp, the windows
      event time again after the repartition (set_timestamp): event time is 2026-01-01 in the
      benchmark's input, which time-based retention (7 days) would delete from the topics.
    """
    from datetime import timedelta

    from quixstreams import message_context
    from quixstreams.models.serializers.avro import AvroDeserializer, AvroSerializer

    counts = {"out": 0}
    events = app.topic(
        input_topic,
        key_deserializer="str",
        value_deserializer=AvroDeserializer(schema=event_schema),
        timestamp_extractor=lambda value, headers, timestamp, kind: int(value["event_time"].timestamp() * 1000),
    )
    out = app.topic(output_topic, key_serializer="str", value_serializer=AvroSerializer(schema=counts_schema))
    latest: dict[int, int] = {}  # input partition -> largest event time seen (ms)
    campaigns: dict[int, set[str]] = {}  # input partition -> campaigns seen
    seen_ttl = timedelta(milliseconds=WATERMARK_DELAY_MS)

    def dedup(event: dict[str, Any], state: Any) -> list[dict[str, str]]:
        partition = message_context().partition
        time_ms = int(event["event_time"].timestamp() * 1000)
        watermark = latest.get(partition, 0) - WATERMARK_DELAY_MS
        latest[partition] = max(latest.get(partition, 0), time_ms)
        if event["event_type"] == "heartbeat":
            return [
                {"campaign_id": c, "event_type": "heartbeat", "event_time": time_ms}
                for c in sorted(campaigns.get(partition, ()))
            ]
        if time_ms < watermark or state.exists("seen"):
            return []
        state.set("seen", True, ttl=seen_ttl)
        campaigns.setdefault(partition, set()).add(event["campaign_id"])
        return [{"campaign_id": event["campaign_id"], "event_type": event["event_type"], "event_time": time_ms}]

    def count(counted: list[int], event: dict[str, str]) -> list[int]:
        kind = event["event_type"]
        return [counted[0] + (kind == "impression"), counted[1] + (kind == "click")]

    def first(event: dict[str, str]) -> list[int]:
        return count([0, 0], event)

    def row(window: dict[str, Any], campaign: str, timestamp: int, headers: Any) -> dict[str, Any]:
        counts["out"] += 1
        stopper.records_out = counts["out"]
        if stopper.expected_out and counts["out"] >= stopper.expected_out:
            stopper.stop()  # this record is still produced; stop() commits it with the rest
        impressions, clicks = window["value"]
        return {
            "campaign_id": campaign,
            "window_start": window["start"],
            "window_end": window["end"],
            "impressions": impressions,
            "clicks": clicks,
        }

    def key(counted: dict[str, Any]) -> str:
        minute = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(counted["window_start"] / 1000))
        return f"{counted['campaign_id']}|{minute}"

    def now(value: Any, key: Any, timestamp: int, headers: Any) -> int:
        return int(time.time() * 1000)

    sdf = app.dataframe(events)
    sdf = sdf.apply(dedup, stateful=True, expand=True)
    # Records written to the repartition topic and the output carry the time they are produced:
    # event time (2026-01-01 in the benchmark's input) would be deleted by time-based retention.
    sdf = sdf.set_timestamp(now)
    sdf = sdf.group_by("campaign_id")
    sdf = sdf.set_timestamp(lambda value, key, timestamp, headers: value["event_time"])
    sdf = sdf.tumbling_window(MINUTE_MS, grace_ms=WATERMARK_DELAY_MS).reduce(count, first)
    sdf = sdf.final(closing_strategy="partition")
    sdf = sdf.filter(lambda window: window["value"][0] + window["value"][1] > 0)
    sdf = sdf.apply(row, metadata=True)
    sdf = sdf.set_timestamp(now)
    sdf.to_topic(out, key=key)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True, help="consumer group (one per run)")
    parser.add_argument("--event-schema", required=True, help="path of ad_event.avsc")
    parser.add_argument("--output-schema", required=True, help="path of ad_view.avsc or campaign_counts.avsc")
    parser.add_argument("--pipeline", choices=("stateless", "stateful"), default="stateless")
    parser.add_argument("--ends", help="input end offsets, 'partition:offset,...' (default: taken at start)")
    parser.add_argument("--state-dir", default="state")
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds (Quix's default: 5)")
    parser.add_argument("--commit-every", type=int, default=0, help="records (Quix's default: 0, time only)")
    parser.add_argument("--expected-out", type=int, default=0, help="stateful: stop once this many windows are out")
    parser.add_argument("--result", help="where to write the JSON summary")
    args = parser.parse_args(argv)
    started = time.time()

    from quixstreams import Application

    ends = parse_ends(args.ends) or end_offsets(args.bootstrap, args.input)
    stopper = StopWhenDone(args.bootstrap, args.group, args.input, ends, args.expected_out)
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_interval,
        commit_every=args.commit_every,
        state_dir=args.state_dir,
        on_message_processed=stopper.on_processed,
        loglevel="WARNING",
    )
    stopper.app = app
    stopper.idle_s = 2 * args.commit_interval + 5  # two checkpoints: the repartition topic is read_committed
    event_schema = json.loads(Path(args.event_schema).read_text())
    output_schema = json.loads(Path(args.output_schema).read_text())
    build = stateless if args.pipeline == "stateless" else stateful
    counts = build(app, args.input, args.output, event_schema, output_schema, stopper)
    watcher = threading.Thread(target=stopper.watch, name="stop-when-done", daemon=True)
    watcher.start()
    if sum(ends.values()) == 0:
        stopper.done_at = time.time()
    else:
        app.run()
    stopper.finished.set()
    closed = time.time()
    summary = {
        "ok": stopper.done_at is not None,
        "records_expected": sum(ends.values()),
        "records_in": stopper.records_in,
        "records_out": counts["out"],
        "started": started,
        "first_record": stopper.first_record_at,
        "done": stopper.done_at,
        "cpu_at_first_record": stopper.cpu_at_first_record,
        "cpu_at_done": stopper.cpu_at_done,
        "cpu_at_close": time.process_time(),
        "closed": closed,
        "pipeline": args.pipeline,
    }
    if args.result:
        Path(args.result).write_text(json.dumps(summary) + "\n")
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

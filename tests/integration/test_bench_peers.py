"""The benchmark's peer baselines (bench/peers: Quix Streams and Kafka Streams, exactly-once) do the
same work as eos's benchmark pipelines: run against a real local broker on ~2,000 generated ad
events, their committed output is exactly the pipeline's output, record for record.

The stateless pipeline's expected output is computed here from the input topic itself (read back,
decoded with fastavro, filtered and projected in plain Python), and compared with each peer's output
(read_committed, decoded) as multisets: a lost, duplicated or altered record fails. The stateful
pipeline's is the generator's ground truth: the distinct events' counts per campaign per minute.

First run only: Maven builds the Kafka Streams peer and pip makes Quix Streams' virtualenv (both
cached under $EOS_HOME); after that the module takes well under two minutes.
"""

from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.inputs import Input, make_input
from bench.peers import VIEW_SCHEMA, live_kstreams, run_kstreams, run_quix
from eos.paths import schemas_dir
from eos_ops.demo import EVENT_SCHEMA, OUTPUT_SCHEMA, generate_events
from tests.support import KafkaUnderTest, read_all

EVENTS = 1_850  # ~2,000 records with the generator's duplicates
SEED = 7  # make_input's: generate_events(EVENTS, SEED) repeats its events and ground truth

pytestmark = pytest.mark.slow


def _schema(path: Path) -> Any:
    """A fastavro schema with logical types dropped: timestamps compare as epoch milliseconds."""
    import fastavro

    def physical(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: physical(v) for k, v in node.items() if k != "logicalType"}
        if isinstance(node, list):
            return [physical(n) for n in node]
        return node

    return fastavro.parse_schema(physical(json.loads(path.read_text())))


def _decode(value: bytes, schema: Any) -> dict[str, Any]:
    import fastavro

    return fastavro.schemaless_reader(io.BytesIO(value), schema, None)


@pytest.fixture(scope="module")
def broker(kafka: KafkaUnderTest) -> KafkaUnderTest:
    """The session's broker: the peers need only its address (topics are this module's own)."""
    return kafka


_RUN = uuid.uuid4().hex[:8]  # input topic names of this session (the broker may outlive it)


@pytest.fixture(scope="module")
def source(broker: KafkaUnderTest) -> Input:
    return make_input(broker.bootstrap, f"peers-input-{_RUN}", 4, EVENTS, seed=SEED)


@pytest.fixture(scope="module")
def source_one(broker: KafkaUnderTest) -> Input:
    """The same events in one partition: see test_quix_stateful_counts_the_distinct_events."""
    return make_input(broker.bootstrap, f"peers-input-p1-{_RUN}", 1, EVENTS, seed=SEED)


@pytest.fixture(scope="module")
def expected_views(broker: KafkaUnderTest, source: Input) -> Counter[tuple[Any, ...]]:
    """(key, event_id, campaign_id, event_type, event_time) of every record the stateless pipeline
    must output: the input as written, filtered and projected here."""
    schema = _schema(schemas_dir() / EVENT_SCHEMA)
    rows: Counter[tuple[Any, ...]] = Counter()
    for message in read_all(broker.bootstrap, source.topic):
        event = _decode(message.value(), schema)
        if event["event_type"] == "heartbeat" or event["campaign_id"] == "campaign-00":
            continue
        rows[
            (event["event_id"], event["event_id"], event["campaign_id"], event["event_type"], event["event_time"])
        ] += 1
    return rows


def _views_out(bootstrap: str, topic: str) -> Counter[tuple[Any, ...]]:
    schema = _schema(VIEW_SCHEMA)
    rows: Counter[tuple[Any, ...]] = Counter()
    for message in read_all(bootstrap, topic, isolation="read_committed"):
        view = _decode(message.value(), schema)
        key = message.key().decode()
        rows[(key, view["event_id"], view["campaign_id"], view["event_type"], view["event_time"])] += 1
    return rows


def _counts_out(bootstrap: str, topic: str) -> Counter[tuple[Any, ...]]:
    schema = _schema(schemas_dir() / OUTPUT_SCHEMA)
    rows: Counter[tuple[Any, ...]] = Counter()
    for message in read_all(bootstrap, topic, isolation="read_committed"):
        row = _decode(message.value(), schema)
        assert row["window_end"] - row["window_start"] == 60_000, row
        assert message.key().decode().startswith(f"{row['campaign_id']}|"), message.key()
        rows[(row["campaign_id"], row["window_start"], row["impressions"], row["clicks"])] += 1
    return rows


def _expected_counts() -> Counter[tuple[Any, ...]]:
    _, truth = generate_events(EVENTS, SEED)
    return Counter((c, start, i, k) for (c, start), (i, k) in truth.expected_counts().items())


def _check_row(row: dict[str, Any], source: Input, records_out: int) -> None:
    assert row["records_in"] == source.records
    assert row["records_seen"] >= source.records  # more only if a transaction was retried
    assert row["records_out"] >= records_out
    assert row["wall_s"] > 0 and row["rps_wall"] > 0
    assert row["cpu_s"] > 0 and row["cpu_us_per_record"] > 0
    assert row["broker_cpu_s"] is not None


def test_quix_stateless_is_the_pipeline(broker: KafkaUnderTest, source: Input, expected_views, tmp_path: Path):
    out = "peers-quix-stateless-out"
    row = run_quix(broker.bootstrap, source.topic, out, source.records, source.partitions, work_dir=tmp_path)
    assert _views_out(broker.bootstrap, out) == expected_views
    _check_row(row, source, sum(expected_views.values()))
    assert row["processes"] == 1


def test_quix_two_processes_share_the_input(broker: KafkaUnderTest, source: Input, expected_views, tmp_path: Path):
    """Two Quix processes in one consumer group split the partitions and both stop by themselves."""
    out = "peers-quix2-stateless-out"
    row = run_quix(
        broker.bootstrap, source.topic, out, source.records, source.partitions, processes=2, work_dir=tmp_path
    )
    assert _views_out(broker.bootstrap, out) == expected_views
    _check_row(row, source, sum(expected_views.values()))


def test_kstreams_stateless_is_the_pipeline(broker: KafkaUnderTest, source: Input, expected_views, tmp_path: Path):
    out = "peers-kstreams-stateless-out"
    row = run_kstreams(broker.bootstrap, source.topic, out, source.records, source.partitions, work_dir=tmp_path)
    assert _views_out(broker.bootstrap, out) == expected_views
    _check_row(row, source, sum(expected_views.values()))
    assert row["threads"] == 2


def test_quix_stateful_counts_the_distinct_events(broker: KafkaUnderTest, source_one: Input, tmp_path: Path):
    """One input partition: the peers keep event time per partition, where Spark keeps one watermark
    for the query, and a backlog's partitions are read unevenly (a whole producer batch of one
    partition before the next), so with several partitions a window can close before a lagging
    partition's events reach it. One partition takes that difference out; what is left is the
    pipeline itself: dedup, late-event rule, windows, heartbeat, keys, Avro."""
    out = "peers-quix-stateful-out"
    row = run_quix(
        broker.bootstrap, source_one.topic, out, pipeline="stateful", expected_out=source_one.windows_expected,
        work_dir=tmp_path,
    )  # fmt: skip
    assert _counts_out(broker.bootstrap, out) == _expected_counts()
    assert row["records_out"] == len(_expected_counts())


def test_kstreams_stateful_counts_the_distinct_events(broker: KafkaUnderTest, source_one: Input, tmp_path: Path):
    """One input partition, as for Quix (above)."""
    out = "peers-kstreams-stateful-out"
    row = run_kstreams(broker.bootstrap, source_one.topic, out, pipeline="stateful", work_dir=tmp_path)
    assert _counts_out(broker.bootstrap, out) == _expected_counts()
    assert row["records_out"] == len(_expected_counts())


def test_kstreams_on_a_live_input_makes_every_record_visible_and_stops_when_told(
    broker: KafkaUnderTest, tmp_path: Path
):
    """The latency section's Kafka Streams row: the peer runs once its stream threads do, the probe
    (bench.probe: live events in, read_committed out) sees every record it wrote through it, and the
    peer closes cleanly when its standard input closes, leaving no consumer group behind."""
    import subprocess
    import sys

    from bench.inputs import ready_topic
    from eos_connectors.kafka.clients import admin_client

    in_topic, out_topic = f"peers-live-in-{_RUN}", f"peers-live-out-{_RUN}"
    ready_topic(broker.bootstrap, in_topic, 4)
    ready_topic(broker.bootstrap, out_topic, 4)
    result = tmp_path / "probe.json"
    probe = [
        sys.executable, "-m", "bench.probe", "--bootstrap", broker.bootstrap, "--input", in_topic,
        "--output", out_topic, "--rate", "200", "--warmup", "1", "--measure", "3", "--drain", "30",
        "--result", str(result),
    ]  # fmt: skip
    with live_kstreams(broker.bootstrap, in_topic, out_topic, work_dir=tmp_path, timeout_s=180) as peer:
        assert peer.poll() is None
        subprocess.run(probe, check=True, timeout=120)
    assert peer.returncode == 0
    latency = json.loads(result.read_text())
    assert latency["expected"] > 400 and latency["visible"] == latency["expected"], latency
    assert 0 < latency["p50_s"] <= latency["p99_s"] <= latency["max_s"], latency
    app_id = peer.args[peer.args.index("--application-id") + 1]
    groups = admin_client({"bootstrap.servers": broker.bootstrap}).list_consumer_groups().result().valid
    assert app_id not in {g.group_id for g in groups}

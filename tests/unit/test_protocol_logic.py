"""Pure logic of the protocol: transactional ids, the ledger's binding to the checkpoint, typed
errors across the Spark boundary, the vote service's leases and decisions (over real sockets)."""

from __future__ import annotations

import itertools
import threading

import pytest

from eos.errors import CheckpointError, DependencyUnavailable, PoisonRecord, TaskError, crossing, from_spark, to_wire
from eos.protocol.channel import ABORT, COMMIT, Liveness, VoteClient, ping
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import DriverInfo
from eos.protocol.ledger import LedgerEntry, check_against_checkpoint, committed_slots
from eos.startup import describe_changes
from eos_connectors.kafka import ids


def test_transactional_ids_never_collide():
    """Names may contain '-' and '.': `{pipeline}-{sink}-{slot}` let pipeline `a` + sink `b-c`
    collide with pipeline `a-b` + sink `c`, and a sink named `events-dlq` with source `events`'s
    dead-letter queue. Built with a separator no name may contain, they cannot."""
    pipelines = ["a", "a-b", "a.b", "events"]
    sinks = ["b-c", "c", "b", "events-dlq", "events.dlq", "out"]
    built = {}
    for pipeline, sink, n in itertools.product(pipelines, sinks, range(3)):
        txid = ids.pool_id(ids.default_prefix(pipeline), sink, n)
        assert txid not in built, f"{(pipeline, sink, n)} and {built[txid]} share {txid}"
        built[txid] = (pipeline, sink, n)
    assert all(ids.driver_id(p) not in built for p in pipelines)
    with pytest.raises(ValueError):
        ids.pool_id("eos/p", "a/b", 0)


def _entry(sink: str, slot: int, epoch: int, offsets: str = "o", config: str = "c", checkpoint: str = "ck"):
    return LedgerEntry("p", sink, slot, epoch, checkpoint, offsets, config)


def test_a_replay_skips_only_slots_that_committed_the_same_offsets_and_config():
    ledger = {("out", 0): _entry("out", 0, 5), ("out", 1): _entry("out", 1, 4)}
    assert committed_slots(ledger, 5, "o", "c") == {("out", 0)}
    assert committed_slots(ledger, 6, "o2", "c") == set()
    with pytest.raises(CheckpointError, match="for other input"):
        committed_slots(ledger, 5, "other offsets", "c")
    with pytest.raises(CheckpointError, match="different pipeline config"):
        committed_slots(ledger, 5, "o", "other config")
    with pytest.raises(CheckpointError, match="offset log was rewound"):
        committed_slots(ledger, 3, "o", "c")


def test_a_ledger_ahead_of_the_offset_log_or_from_another_checkpoint_is_refused():
    ledger = {("out", 0): _entry("out", 0, 7)}
    check_against_checkpoint(ledger, "ck", 7, "ledger")
    with pytest.raises(CheckpointError, match="older than the output"):
        check_against_checkpoint(ledger, "ck", 6, "ledger")
    with pytest.raises(CheckpointError, match="older than the output"):
        check_against_checkpoint(ledger, "ck", None, "ledger")
    with pytest.raises(CheckpointError, match="another checkpoint"):
        check_against_checkpoint(ledger, "other", 7, "ledger")


def test_typed_errors_survive_sparks_rewrapping():
    with pytest.raises(TaskError) as raised, crossing():
        raise PoisonRecord("source s: cannot decode the record at t/0 offset 7: bad", hint="use dlq")
    # Spark quotes a task failure in its own text, several times, with other lines around it.
    text = f"py4j.Py4JJavaError: ...\nPythonException: {raised.value}\n  at ...\nCaused by: {raised.value}"
    rebuilt = from_spark(RuntimeError(text))
    assert isinstance(rebuilt, PoisonRecord)
    assert rebuilt.message == "source s: cannot decode the record at t/0 offset 7: bad" and rebuilt.hint == "use dlq"
    assert isinstance(from_spark(RuntimeError(to_wire(DependencyUnavailable("registry lags")))), DependencyUnavailable)
    assert from_spark(RuntimeError("an executor was lost")) is None


def test_config_changes_are_described_field_by_field():
    before = {"sinks": [{"name": "out", "key": "key"}], "parallelism": 2}
    after = {"sinks": [{"name": "out", "key": "concat(key, 'x')"}], "parallelism": 2}
    assert describe_changes(before, after) == ["sinks[out].key: 'key' -> \"concat(key, 'x')\""]


@pytest.fixture
def coordinator():
    service = Coordinator(bind_host="127.0.0.1", advertise_host="127.0.0.1", identity={"pipeline": "p", "run": "r"})
    yield service
    service.close()


def test_leases_reuse_a_workers_idle_id_and_record_growth_first(coordinator):
    grown: list[dict[str, int]] = []
    coordinator.on_grow = grown.append
    coordinator.grow_step = 2
    coordinator.set_pools({"out": 0})
    coordinator.open_attempt(1, 1, 30)
    client = VoteClient(coordinator.address, 1, 1, 30)
    first = client.request("lease", sink="out", slot=0, worker="w1", idle=[])
    assert first == {"number": 0, "fresh": True, "stale": []} and grown == [{"out": 2}]
    second = client.request("lease", sink="out", slot=1, worker="w2", idle=[])
    assert second["number"] == 1 and second["fresh"]
    third = client.request("lease", sink="out", slot=2, worker="w1", idle=[])
    assert third["number"] == 2 and grown[-1] == {"out": 4}  # ids 0 and 1 are busy: the pool grows
    # Transactions end; next epoch each worker gets its own idle id back, with no initialisation.
    for number in (0, 1, 2):
        client.request("committed", sink="out", handle=f"h{number}", slot=number)  # unknown votes: harmless
    coordinator.close_attempt(1, 1, "finished")
    coordinator.set_pools({"out": 4})  # recovery fenced everything: nothing is owned any more
    coordinator.open_attempt(2, 1, 30)
    again = VoteClient(coordinator.address, 2, 1, 30)
    assert again.request("lease", sink="out", slot=0, worker="w1", idle=[0, 2])["fresh"]  # not owned since the fence
    owned = again.request("lease", sink="out", slot=1, worker="w1", idle=[])
    _vote_and_commit(coordinator, again, "h-owned", owned["number"])
    strays = coordinator.close_attempt(2, 1, "finished")
    # The first id of attempt 2 was leased but never voted on: it is handed back to be fenced.
    assert [(v.sink, v.handle, v.lease) for v in strays] == [("out", "", 0)]
    coordinator.open_attempt(3, 1, 30)
    later = VoteClient(coordinator.address, 3, 1, 30)
    reuse = later.request("lease", sink="out", slot=0, worker="w1", idle=[owned["number"]])
    assert reuse == {"number": owned["number"], "fresh": False, "stale": []}
    stolen = later.request("lease", sink="out", slot=1, worker="w2", idle=[owned["number"]])
    assert owned["number"] in stolen["stale"]  # w2 no longer owns it: it must close its producer


def _vote_and_commit(coordinator, client: VoteClient, handle: str, lease: int) -> None:
    """What a slot's commit thread does, on the connection that leased the id: vote prepared,
    wait, commit, report."""
    epoch, attempt = client.epoch, client.attempt

    def owner() -> None:
        if client.request("prepared", sink="out", handle=handle, slot=0, lease=lease)["decision"] == COMMIT:
            client.request("committed", sink="out", handle=handle, slot=0, lease=lease)

    thread = threading.Thread(target=owner)
    thread.start()
    waited = threading.Event()
    while not coordinator.votes(epoch, attempt):
        assert not waited.wait(0.02) and thread.is_alive(), "the vote was not recorded"
    coordinator.release(epoch, attempt, [("out", handle)])
    assert coordinator.wait_committed(epoch, attempt, [("out", handle)], 10) == []
    thread.join(10)


def test_owners_commit_only_what_the_driver_released(coordinator):
    coordinator.open_attempt(4, 1, 30)
    replies: dict[str, dict] = {}

    def vote(handle: str) -> None:
        client = VoteClient(coordinator.address, 4, 1, 30)
        replies[handle] = client.request("prepared", sink="out", handle=handle, slot=int(handle[-1]), lease=None)
        if replies[handle].get("decision") == COMMIT:
            client.request("committed", sink="out", handle=handle, slot=int(handle[-1]))

    threads = [threading.Thread(target=vote, args=(h,)) for h in ("t0", "t1")]
    for t in threads:
        t.start()
    deadline = threading.Event()
    while len(coordinator.votes(4, 1)) < 2 and not deadline.wait(0.05):
        pass
    coordinator.release(4, 1, [("out", "t0")])
    assert coordinator.wait_committed(4, 1, [("out", "t0")], 10) == []
    strays = coordinator.close_attempt(4, 1, "finished")
    for t in threads:
        t.join(10)
    assert replies["t0"]["decision"] == COMMIT and replies["t1"]["decision"] == ABORT
    assert [v.handle for v in strays] == ["t1"]
    late = VoteClient(coordinator.address, 4, 1, 30).request("prepared", sink="out", handle="t9", slot=9)
    assert late["decision"] == ABORT  # a stalled task of a finished attempt can never commit


def test_a_vote_from_another_run_is_refused_and_ping_answers(coordinator):
    coordinator.open_attempt(1, 1, 30)
    stranger = VoteClient(coordinator.address.__class__("127.0.0.1", coordinator.address.port, "x"), 1, 1, 30)
    assert stranger.request("prepared", sink="out", handle="h", slot=0)["decision"] == ABORT
    me = DriverInfo("r", "h", 1, coordinator.address.hostport, pipeline="p", ping_key=coordinator.ping_key)
    assert ping(me) is Liveness.ALIVE
    assert ping(DriverInfo("r", "h", 1, "127.0.0.1:1", pipeline="p", ping_key=coordinator.ping_key)) is Liveness.SILENT


def test_a_failed_attempt_names_the_python_exception_spark_quotes():
    from eos.protocol.committer import reason_of

    text = (
        "An error occurred while calling o427.collectToPython.\n: org.apache.spark.SparkException: Job aborted\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 3, in main\n    process()\n'
        'confluent_kafka.KafkaException: KafkaError{code=_TIMED_OUT,val=-185,str="Transactional API timed out"}\n'
    )
    assert reason_of(RuntimeError(text)).startswith("KafkaException: KafkaError{code=_TIMED_OUT")
    assert reason_of(RuntimeError("something odd\nmore")) == "RuntimeError: something odd"


def test_the_source_failpoints_fire_by_count_and_refuse_an_epoch():
    from eos.failpoints import PROTOCOL_POINTS, parse

    assert "source.plan" not in PROTOCOL_POINTS and "sink.after_precommit" in PROTOCOL_POINTS
    [point] = parse("source.plan=pause(5)@times=2")
    assert (point.name, point.action, point.arg, point.times) == ("source.plan", "pause", 5.0, 2)
    with pytest.raises(ValueError, match=r"source\.plan cannot know its epoch; use times=N"):
        parse("source.plan=kill@epoch=1")

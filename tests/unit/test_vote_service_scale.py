"""The vote service's cost grows linearly with the epoch's transactions (docs/SCALING.md): the
driver's wait for the commit reports looked at every transaction of the epoch each time one
report arrived, O(transactions^2): 15% of the driver's CPU at 256 slots x 4 sinks. Real
Coordinator, real sockets, no Spark."""

from __future__ import annotations

import threading
import time

from eos.protocol.channel import COMMIT, VoteClient
from eos.protocol.coordinator import Coordinator


class CountingVotes(dict):
    """The attempt's votes, counting how often the driver looks one up."""

    lookups = 0

    def get(self, key, default=None):
        CountingVotes.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key):
        CountingVotes.lookups += 1
        return super().__getitem__(key)


def test_waiting_for_n_commit_reports_looks_at_each_vote_a_bounded_number_of_times():
    slots = 300
    service = Coordinator(identity={"pipeline": "p", "run": "r"}, slots=slots)
    try:
        service.set_pools({"out": slots})
        state = service.open_attempt(1, 1, 60)
        state.votes = CountingVotes()
        clients = [VoteClient(service.address, 1, 1, 60) for _ in range(slots)]
        votes, decided = [], []
        for slot, client in enumerate(clients):
            lease = client.request("lease", sink="out", slot=slot, worker=f"w{slot}", idle=[])["number"]
            votes.append({"sink": "out", "handle": f"eos/p/out/{lease}", "slot": slot, "lease": lease})
        threads = [
            threading.Thread(target=lambda c=c, v=v: decided.append(c.request("prepared", **v)))
            for c, v in zip(clients, votes, strict=True)
        ]
        for thread in threads:
            thread.start()
        with service._lock:
            assert service._lock.wait_for(lambda: len(state.votes) == slots, 30)
        keys = [("out", v["handle"]) for v in votes]
        service.release(1, 1, keys)
        for thread in threads:
            thread.join(30)
        assert [d["decision"] for d in decided] == [COMMIT] * slots

        def report(part: slice) -> None:  # one at a time, as slots finish their commits
            for client, vote in list(zip(clients, votes, strict=True))[part]:
                assert client.request("committed", **vote) == {"ok": True}

        CountingVotes.lookups = 0
        wakes = []
        notify_all = service._lock.notify_all
        service._lock.notify_all = lambda: (wakes.append(1), notify_all())  # type: ignore[method-assign]
        # Some slots report before the driver starts to wait (CI once saw this by chance, and each
        # such report woke the driver), the rest while it waits.
        report(slice(0, slots // 3))
        reporter = threading.Thread(target=report, args=(slice(slots // 3, None),))
        reporter.start()
        assert service.wait_committed(1, 1, keys, 30) == []
        reporter.join(30)
        # The driver is woken when its wait can end, not at every report (a thread switch each).
        assert len(wakes) <= 2, f"{len(wakes)} wake-ups for {slots} reports"
        # Linear: each report costs the service a lookup or two, and the wait a scan of the keys
        # once; looking at every vote on every report cost ~3 x slots per report.
        assert CountingVotes.lookups <= 10 * slots, f"{CountingVotes.lookups} lookups for {slots} reports"
    finally:
        service.close()


def test_a_conversation_reuses_the_processs_idle_connection_to_the_same_run():
    """A slot's conversation ends with its connection idle and answered: the next one of this
    process (another sink, the next epoch) takes it instead of connecting, which cost the driver an
    accept, a hello and a close per transaction. Another run (a new key) never gets it."""
    # The service checks a connection's deadline when its one timer fires (first at the hello
    # timeout): 1 s here, so the idle timeout set below is seen within a second.
    service = Coordinator(identity={"pipeline": "p", "run": "r"}, slots=2, hello_timeout_s=1.0)
    other = Coordinator(identity={"pipeline": "p", "run": "r2"}, slots=2)
    try:
        for coordinator in (service, other):
            coordinator.set_pools({"out": 4})
            coordinator.open_attempt(1, 1, 60)
        for epoch_slot in range(3):
            client = VoteClient(service.address, 1, 1, 60)
            assert "number" in client.request("lease", sink="out", slot=epoch_slot, worker="w", idle=[])
            client.close()
        assert len(service._open) == 1  # three conversations, one connection
        stranger = VoteClient(other.address, 1, 1, 60)
        assert "number" in stranger.request("lease", sink="out", slot=0, worker="w", idle=[])
        stranger.close()
        assert len(other._open) == 1 and len(service._open) == 1

        # The service closes a connection idle for too long: the next conversation connects anew.
        service.idle_timeout_s = 0.2
        client = VoteClient(service.address, 1, 1, 60)
        assert "number" in client.request("lease", sink="out", slot=3, worker="w", idle=[])
        client.close()
        deadline = time.monotonic() + 30
        while service._open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not service._open
        client = VoteClient(service.address, 1, 1, 60)
        reply = client.request("lease", sink="out", slot=3, worker="w", idle=[])
        assert "number" in reply, reply  # answered, not "vote service unreachable"
        client.close()
    finally:
        service.close()
        other.close()


def test_the_connection_cap_grows_with_slots_times_sinks():
    """Every slot holds a connection per sink while it waits for the decision: 256 slots x 4 sinks
    is the whole default cap, and one more connection (a retried task) was refused."""
    small = Coordinator(slots=4)
    large = Coordinator(slots=256)
    try:
        small.set_pools({"a": 1, "b": 1})
        large.set_pools({sink: 1 for sink in "abcd"})
        assert small.max_connections == 1024
        assert large.max_connections == 2 * 256 * 4
    finally:
        small.close()
        large.close()


def test_a_pool_grows_by_doubling_so_a_wide_first_epoch_records_few_growths():
    """Each growth is a transaction in the control log, written on the vote service's loop while
    every lease waits: 256 slots x 4 sinks from empty pools recorded 256 growths of 4 ids, 3.5 s of
    the loop's time (docs/SCALING.md). Doubling records a handful per sink, and a pool is never more
    than twice what the epoch used at once."""
    slots = 64
    service = Coordinator(identity={"pipeline": "p", "run": "r"}, slots=slots)
    try:
        recorded: list[dict[str, int]] = []
        service.on_grow = recorded.append
        service.set_pools({"out": 0})
        service.open_attempt(1, 1, 60)
        client = VoteClient(service.address, 1, 1, 60)
        for slot in range(slots):  # every id stays busy: no vote, no report
            assert "number" in client.request("lease", sink="out", slot=slot, worker=f"w{slot}", idle=[])
        client.close()
        assert len(recorded) <= 5  # 4, 8, 16, 32, 64
        assert slots <= service.pool_sizes()["out"] <= 2 * slots
    finally:
        service.close()

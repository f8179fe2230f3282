"""The vote service under attack (issue 35, "No one let in"): a real Coordinator on real sockets,
no Spark. The attacker is anyone who reaches its port (another user of the host, a network
peer); where it says so, one that holds the run's key (a task of this very run gone wrong).

Each test is one of the reproduced holes: a forged `committed` ended the driver's wait while the
slot was still committing; the run's secret crossed the wire in every message and a recorded
message could be sent again; a line without end or a pile of idle connections grew the driver
without bound; the service listened on every interface; a ping told anyone the driver's pid,
host, pipeline and run; another pipeline's service on a reused port blocked a start; a storm of
leases grew the pools (fenced at every recovery, for ever)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from eos.config import CoordinatorConfig
from eos.driver import coordinator_for, take_over
from eos.errors import CheckpointError, ConfigError
from eos.protocol.channel import COMMIT, CoordinatorAddress, Liveness, VoteClient, new_key, peer_hello, ping
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState, Decision, DriverInfo, Pool

PIPELINE, RUN = "orders-pipeline", "5f3c9a7e21b4"
HANDLE = "eos/orders-pipeline/out/0"


@pytest.fixture
def service():
    coordinator = Coordinator(identity={"pipeline": PIPELINE, "run": RUN}, slots=2)
    coordinator.set_pools({"out": 0})
    coordinator.open_attempt(1, 1, 30)
    yield coordinator
    coordinator.close()


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _converse(port: int, data: bytes, host: str = "127.0.0.1", timeout_s: float = 5.0) -> bytes:
    """Send `data` on a new connection and return everything received until the service closes
    it (or `timeout_s` passes)."""
    received = b""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    return received


def _secrets(address: CoordinatorAddress) -> list[str]:
    """Every secret the tasks are given to talk to the service (the run key; the token before)."""
    return [getattr(address, f.name) for f in fields(address) if f.name not in ("host", "port")]


# ---------------------------------------------------------------------------------------------
# 1. A vote belongs to its connection
# ---------------------------------------------------------------------------------------------


def test_a_commit_report_counts_only_from_the_connection_that_voted(service):
    """Another process with the run's key reports the slot's transaction committed while the slot
    is still committing: the driver must keep waiting for the slot, and the slot's id must stay
    busy (freed early, another task would get a producer whose transaction is still open)."""
    slot = VoteClient(service.address, 1, 1, 30)
    lease = slot.request("lease", sink="out", slot=0, worker="w1", idle=[])["number"]
    vote = {"sink": "out", "handle": HANDLE, "slot": 0, "lease": lease}
    decided: dict = {}
    voting = threading.Thread(target=lambda: decided.update(slot.request("prepared", **vote)))
    voting.start()
    _until(lambda: service.votes(1, 1))
    service.release(1, 1, [("out", HANDLE)])
    voting.join(10)
    assert decided["decision"] == COMMIT  # the slot now commits its Kafka transaction...

    forger = VoteClient(service.address, 1, 1, 30)  # ...and someone else says it is done
    pending = [f"no commit report within 0 s from out {HANDLE}"]
    forger.request("committed", **vote)
    assert service.wait_committed(1, 1, [("out", HANDLE)], 0.3) == pending
    forger.request("commit_failed", **vote, error="forged")
    assert service.wait_committed(1, 1, [("out", HANDLE)], 0.3) == pending
    same_worker = VoteClient(service.address, 1, 1, 30).request("lease", sink="out", slot=1, worker="w1", idle=[lease])
    assert same_worker["number"] != lease  # still busy: its transaction is still being committed
    assert slot.request("committed", **vote) == {"ok": True}
    assert service.wait_committed(1, 1, [("out", HANDLE)], 5) == []


def test_a_second_vote_for_one_transaction_fails_the_attempt(service):
    """A process with the run's key votes `prepared` for a slot's transaction (its name is easy
    to guess) on a connection of its own: it is refused, and since one of the two lies, the
    driver takes neither's word for the commit: the attempt fails and is replayed."""
    slot, forger = VoteClient(service.address, 1, 1, 30), VoteClient(service.address, 1, 1, 30)
    vote = {"sink": "out", "handle": HANDLE, "slot": 0}
    replies: list[dict] = []
    voting = threading.Thread(target=lambda: replies.append(slot.request("prepared", **vote)))
    voting.start()
    _until(lambda: service.votes(1, 1))
    refused = forger.request("prepared", **vote)
    assert refused["decision"] != COMMIT and "already voted on another connection" in refused["error"]
    service.release(1, 1, [("out", HANDLE)])
    voting.join(10)
    slot.request("committed", **vote)
    problems = service.wait_committed(1, 1, [("out", HANDLE)], 5)
    assert problems == [f"out {HANDLE}: two connections voted prepared for it"]


# ---------------------------------------------------------------------------------------------
# 2. Authenticated messages; the key never on the wire; no replay
# ---------------------------------------------------------------------------------------------


class Relay:
    """A TCP relay that records both directions, as someone on the network would."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.to_service = bytearray()
        self.to_peer = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = self.listener.accept()
                service = socket.create_connection(("127.0.0.1", self.upstream_port))
                threading.Thread(target=self._pump, args=(peer, service, self.to_service), daemon=True).start()
                threading.Thread(target=self._pump, args=(service, peer, self.to_peer), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, record: bytearray) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                record.extend(data)
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def test_the_key_never_crosses_the_wire_and_a_recorded_conversation_cannot_be_replayed(service):
    relay = Relay(service.address.port)
    slot = VoteClient(replace(service.address, port=relay.port), 1, 1, 30)
    assert slot.request("lease", sink="out", slot=0, worker="w1", idle=[])["number"] == 0
    slot.close()
    _until(lambda: b'"number"' in relay.to_peer)
    relay.close()
    wire = bytes(relay.to_service + relay.to_peer)
    for secret in _secrets(service.address):
        assert secret.encode() not in wire
        with contextlib.suppress(ValueError):
            assert bytes.fromhex(secret) not in wire
        assert secret not in repr(service.address)

    # Sent again, word for word, on a new connection: nothing is leased.
    replayed = _converse(service.address.port, bytes(relay.to_service))
    assert b'"number"' not in replayed and b"refused" in replayed
    assert service.pool_sizes() == {"out": 4}  # the one lease's growth
    assert [v.lease for v in service.close_attempt(1, 1, "done")] == [0]  # one id leased, never voted


def test_a_message_without_the_runs_mac_is_refused(service):
    lease = {"op": "lease", "epoch": 1, "attempt": 1, "sink": "out", "slot": 0, "worker": "w", "idle": []}
    # The secret itself, sent along as a token (the protocol before MACs): not a MAC.
    for secret in _secrets(service.address):
        answer = _converse(service.address.port, peer_hello(secrets.token_bytes(16)) + (json.dumps(
            {**lease, "token": secret}) + "\n").encode())  # fmt: skip
        assert b'"number"' not in answer and b"refused" in answer
        answer = _converse(service.address.port, (json.dumps({**lease, "token": secret}) + "\n").encode())
        assert b'"number"' not in answer
    # A slot of another run (another key) is refused the same way.
    stranger = VoteClient(replace(service.address, key=new_key()), 1, 1, 30)
    refused = stranger.request("lease", sink="out", slot=0, worker="w", idle=[])
    assert "number" not in refused and "refused" in refused["error"]
    assert service.pool_sizes() == {"out": 0}


# ---------------------------------------------------------------------------------------------
# 3. Not crashable
# ---------------------------------------------------------------------------------------------


def _peak_rss_kib() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))


def test_an_endless_line_is_cut_off_and_costs_the_driver_no_memory(service):
    """The driver is this process: a stream of up to 1 GiB without a newline must not raise its
    peak memory, and the service closes the connection long before the end."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM, the peak resident size
    before = _peak_rss_kib()
    chunk, sent = b"x" * (1 << 20), 0
    with socket.create_connection(("127.0.0.1", service.address.port), timeout=10) as sock, pytest.raises(OSError):
        while sent < 1 << 30:
            sock.sendall(chunk)
            sent += len(chunk)
    assert sent < 64 << 20  # closed after the first line's worth, not after 1 GiB
    assert _peak_rss_kib() - before < 16 * 1024
    slot = VoteClient(service.address, 1, 1, 30)  # and the service still serves
    assert slot.request("lease", sink="out", slot=0, worker="w", idle=[])["number"] == 0


def test_idle_connections_cost_no_thread_and_are_closed():
    service = Coordinator(identity={"pipeline": PIPELINE, "run": RUN}, hello_timeout_s=0.5)
    try:
        threads = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", service.address.port), timeout=10) for _ in range(500)]
        time.sleep(0.3)
        assert threading.active_count() - threads <= 1
        for sock in idle:  # each gets the hello, then, with nothing sent, its end
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
            assert received.count(b"\n") == 1 and b'"nonce"' in received
            sock.close()
    finally:
        service.close()


def _was_closed(sock: socket.socket) -> bool:
    """Whether the service closed this connection (read without waiting)."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        return False
    finally:
        sock.close()
    return True


def test_the_connection_cap_keeps_room_for_the_slots(caplog):
    service = Coordinator(identity={"pipeline": PIPELINE, "run": RUN}, max_connections=20)
    try:
        service.open_attempt(1, 1, 30)
        strangers = [socket.create_connection(("127.0.0.1", service.address.port), timeout=10) for _ in range(50)]
        slot = VoteClient(service.address, 1, 1, 30)  # evicts the oldest stranger, not refused
        assert slot.request("lease", sink="out", slot=0, worker="w", idle=[])["number"] == 0
        time.sleep(0.2)
        closed = sum(_was_closed(sock) for sock in strangers)
        assert closed >= 31  # at most 20 open at once, one of them the slot's
        assert "connections are open, the most it keeps (max_connections)" in caplog.text
    finally:
        service.close()


# ---------------------------------------------------------------------------------------------
# 4. It listens only where the executors reach it
# ---------------------------------------------------------------------------------------------


class _Conf:
    def __init__(self, values: dict[str, str]):
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


def _spark(master: str, **conf: str) -> SimpleNamespace:
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master), conf=_Conf(conf))


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_the_vote_service_listens_only_on_the_advertised_host():
    identity = {"pipeline": PIPELINE, "run": RUN}
    cluster = _spark("spark://master:7077", **{"spark.driver.host": "127.0.0.2"})
    for config, spark, advertised in [
        (SimpleNamespace(coordinator=CoordinatorConfig()), cluster, "127.0.0.2"),
        (SimpleNamespace(coordinator=CoordinatorConfig(host="127.0.0.3")), cluster, "127.0.0.3"),
        (SimpleNamespace(coordinator=CoordinatorConfig()), _spark("local[2]"), "127.0.0.1"),
    ]:
        service = coordinator_for(config, spark, identity)
        try:
            port = service.address.port
            assert service.address.host == advertised and _answers(advertised, port)
            assert not any(_answers(other, port) for other in {"127.0.0.1", "127.0.0.2", "127.0.0.3"} - {advertised})
        finally:
            service.close()
    # Behind NAT (spark.driver.bindAddress, as Spark's own driver): bound there, advertised as said.
    nat = _spark(
        "spark://master:7077", **{"spark.driver.host": "driver.example", "spark.driver.bindAddress": "127.0.0.4"}
    )
    service = coordinator_for(SimpleNamespace(coordinator=CoordinatorConfig()), nat, identity)
    try:
        assert service.address.host == "driver.example" and _answers("127.0.0.4", service.address.port)
    finally:
        service.close()
    with pytest.raises(ConfigError, match=r"the vote service cannot listen on 192\.0\.2\.1"):
        coordinator_for(SimpleNamespace(coordinator=CoordinatorConfig(host="192.0.2.1")), cluster, identity)


# ---------------------------------------------------------------------------------------------
# 5. A ping tells a stranger nothing; the recorded driver proves it is alive
# ---------------------------------------------------------------------------------------------


def test_a_ping_tells_a_stranger_nothing(service):
    told = {str(os.getpid()), socket.gethostname(), PIPELINE, RUN}
    for question in (b'{"op": "ping"}\n', peer_hello(secrets.token_bytes(16)) + b'{"op": "ping"}\n'):
        for line in _converse(service.address.port, question).splitlines():
            answer = json.loads(line)
            assert set(answer) <= {"eos", "nonce", "proof", "error"}
            assert not told & {str(value) for value in answer.values()}
    recorded = DriverInfo(RUN, "h", 1, service.address.hostport, pipeline=PIPELINE, ping_key=service.ping_key)
    assert ping(recorded) is Liveness.ALIVE
    assert ping(replace(recorded, ping_key=new_key())) is Liveness.OTHER
    assert ping(replace(recorded, run="another run")) is Liveness.OTHER
    assert ping(replace(recorded, pipeline="another pipeline")) is Liveness.OTHER
    assert service.ping_key not in repr(recorded)


# ---------------------------------------------------------------------------------------------
# 6. Take-over: only the recorded driver counts
# ---------------------------------------------------------------------------------------------


class MemoryControl(ControlLog):
    """A control log in memory (only what take_over uses; pure logic)."""

    def __init__(self, previous: DriverInfo | None):
        self.previous = previous

    def state(self) -> ControlState:
        return ControlState(previous=self.previous)

    def take_over(self, driver: DriverInfo) -> ControlState:
        state, self.previous = self.state(), driver
        return state

    def record_decision(self, decision: Decision) -> None:
        raise NotImplementedError

    def record_pools(self, pools: dict[str, Pool]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


def test_take_over_ignores_another_pipelines_service_on_the_recorded_port(capsys):
    other = Coordinator(identity={"pipeline": "another-pipeline", "run": "a1b2c3d4e5f6"})
    alive = Coordinator(identity={"pipeline": PIPELINE, "run": RUN})
    me = DriverInfo("0f0f0f0f0f0f", socket.gethostname(), os.getpid(), "127.0.0.1:0", pipeline=PIPELINE)
    try:
        # The recorded driver is gone; another pipeline's vote service now holds its port.
        gone = DriverInfo(RUN, "worker-3", 4711, other.address.hostport, pipeline=PIPELINE, ping_key=new_key())
        control = MemoryControl(gone)
        assert take_over(control, me, allow=False).previous == gone
        assert control.previous == me
        said = capsys.readouterr().err
        assert f"address {other.address.hostport} answers, but not as that driver (pid 4711" in said
        # The recorded driver itself, still running: refused, as before.
        running = DriverInfo(RUN, "worker-3", 4711, alive.address.hostport, pipeline=PIPELINE, ping_key=alive.ping_key)
        with pytest.raises(CheckpointError, match="another eos driver is running this pipeline: pid 4711"):
            take_over(MemoryControl(running), me, allow=False)
    finally:
        other.close()
        alive.close()


# ---------------------------------------------------------------------------------------------
# 7. Pool growth per attempt is capped
# ---------------------------------------------------------------------------------------------


def test_a_storm_of_leases_is_capped_and_a_legitimate_attempt_is_not():
    service = Coordinator(identity={"pipeline": PIPELINE, "run": RUN}, slots=16)
    try:
        recorded: list[dict[str, int]] = []
        service.on_grow = recorded.append
        service.set_pools({"out": 0})
        service.open_attempt(1, 1, 30)
        # Every one of 16 slots run 8 times (4 failures, a speculative copy of each), each attempt
        # with an id of its own: what a legitimate attempt can need at most.
        tasks = [VoteClient(service.address, 1, 1, 30) for _ in range(16 * 8)]
        granted = [t.request("lease", sink="out", slot=i % 16, worker=f"w{i}", idle=[]) for i, t in enumerate(tasks)]
        assert all("number" in g for g in granted)
        # A storm beyond that gets a clear error, and the recorded pools stop growing.
        storm = VoteClient(service.address, 1, 1, 30)
        refused = [storm.request("lease", sink="out", slot=0, worker="x", idle=[]) for _ in range(2000)]
        assert not any("number" in r for r in refused)
        assert "the most one attempt may add (max_new_ids: 128)" in refused[0]["error"]
        assert recorded[-1] == {"out": 128} and service.pool_sizes() == {"out": 128}
    finally:
        service.close()

"""Step 3, the vote: a small service in the driver that slots talk to over TCP (Flink's
JobManager role). It does three things:

- **Votes.** A slot whose transaction only its own producer can commit (Kafka) sends one
  `prepared` vote when its transaction is pre-committed, then leaves the connection with a
  thread of its Python worker and lets the task finish. The thread waits for the decision:
  `commit` once the driver has every slot's report and has recorded the decision, `abort`
  otherwise (the attempt failed, was superseded, or timed out). A stalled task of an aborted
  attempt that wakes up later is told `abort`; one whose driver died gets no answer at all: in
  neither case can it commit. Safety does not rest on this alone: recovery fences every
  transactional id before a new attempt reads the ledger. A vote belongs to its connection:
  only the connection that voted `prepared` for a transaction may report it `committed` or
  `commit_failed`, and it may vote only with an id it leased itself; a second connection voting
  for the same transaction fails the attempt (one of the two lies).
- **Leases** of transactional identities. A sink's transactional ids are a numbered pool; the
  coordinator hands each slot an id its Python worker already holds idle (no `init_transactions`,
  no new producer: affinity between a producer and the process that keeps it), or else a free
  one to initialise. The pool only grows, and every growth is recorded durably (control log)
  before the id is used, so recovery can fence every id that ever held a transaction. One
  attempt adds at most `max_new_ids` ids (NEW_IDS_PER_SLOT per slot): ids are fenced at every
  recovery for ever, so a runaway task (or worse) cannot make every later start slow.
- **Liveness.** A new driver asks the previous driver's service whether it still runs before it
  takes the pipeline over (`ping`): the answer proves it with the ping key recorded in the
  control log, and tells anyone else nothing.

The wire (handshake, MACs, the line cap) is eos.protocol.channel. The service runs on one asyncio
loop in a thread of its own, driven by callbacks (no task per connection or request: each costs a
loop iteration): a connection costs a buffer of MAX_LINE bytes and no thread, a slot waiting for
its decision is an entry in `_waiting`. What a peer can cost the driver is bounded:
a line longer than MAX_LINE closes its connection; a peer has `hello_timeout_s` from connecting
to its first authenticated request, and an authenticated one may stay idle up to the longest
epoch timeout plus a minute (a slot leases, writes for up to the epoch's timeout, then votes;
waiting for the decision is not reading); at most `max_connections` are open, and when a new one
would exceed that the oldest not yet authenticated is closed. One round trip on loopback costs
well under a millisecond (Spark's BarrierTaskContext.allGather polls once a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eos.protocol.channel import (
    ABORT,
    COMMIT,
    MAX_LINE,
    CoordinatorAddress,
    Session,
    new_key,
    proof,
    read_nonce,
    service_hello,
)

log = logging.getLogger("eos.coordinator")

MAX_CONNECTIONS = 1024
HELLO_TIMEOUT_S = 10.0
IDLE_GRACE_S = 60.0
PING = b'{"op": "ping"}'
# Spark runs a task up to spark.task.maxFailures (4) times, and a speculative copy of each: every
# one of them may need an id of its own while the failed one's stays busy until the attempt ends.
NEW_IDS_PER_SLOT = 8
MIN_NEW_IDS = 64  # a pipeline whose transforms repartition beyond its `slots` still fits


@dataclass
class Vote:
    slot: int
    sink: str
    handle: str
    lease: int | None
    task_attempt: int
    records: int = 0
    decision: str | None = None
    reason: str = ""
    committed: bool = False
    error: str = ""
    connection: Any = field(default=None, repr=False, compare=False)  # the one that voted


@dataclass
class Pool:
    size: int = 0
    owner: dict[int, str] = field(default_factory=dict)  # id -> worker process that initialised it
    busy: set[int] = field(default_factory=set)  # ids holding an open transaction


@dataclass
class AttemptState:
    epoch: int
    attempt: int
    deadline: float
    votes: dict[tuple[str, str], Vote] = field(default_factory=dict)  # (sink, handle) -> vote
    released: set[tuple[str, str]] = field(default_factory=set)  # told to commit
    leases: dict[tuple[str, int], Pool] = field(default_factory=dict)  # granted in this attempt, from that pool
    new_ids: int = 0  # ids this attempt added to the pools
    closed: str | None = None  # why the attempt ended; undecided votes are aborted
    opened_at: float = field(default_factory=time.monotonic)
    # What the driver's wait_committed waits on, kept up to date by each report: a report costs
    # O(1), not a look at every vote of the epoch (which made the wait O(transactions^2)).
    watched: set[tuple[str, str]] = field(default_factory=set)  # the keys the driver waits on
    uncommitted: set[tuple[str, str]] = field(default_factory=set)  # ...whose commit is not reported yet
    problems: dict[tuple[str, str], str] = field(default_factory=dict)  # ...whose vote failed

    def settle(self, key: tuple[str, str], vote: Vote) -> None:
        """A watched vote's outcome changed (under the coordinator's lock)."""
        if key not in self.watched:
            return
        if vote.error:
            self.problems.setdefault(key, f"{key[0]} {key[1]}: {vote.error}")
        if vote.committed:
            self.uncommitted.discard(key)
        else:
            self.uncommitted.add(key)

    def decision_for(self, key: tuple[str, str]) -> tuple[str | None, str]:
        if key in self.released:
            return COMMIT, ""
        if self.closed is not None:
            return ABORT, self.closed
        return None, ""


class Coordinator:
    """The driver side. Thread-safe: the driver's calls take `_lock`, and so does the service's
    loop thread for each request (briefly; it never waits on it)."""

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str = "127.0.0.1",
        identity: dict[str, Any] | None = None,
        slots: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
    ):
        self.identity = {"pid": os.getpid(), "host": socket.gethostname(), **(identity or {})}
        self.ping_key = new_key()  # recorded in the control log: proves this driver is alive
        self._key = new_key()  # the run key: reaches the tasks inside the EpochPlan, never the wire
        self._lock = threading.Condition()
        self._attempts: dict[tuple[int, int], AttemptState] = {}
        self._pools: dict[str, Pool] = {}
        self.on_grow: Callable[[dict[str, int]], None] | None = None  # records pool sizes durably
        self.grow_step = 4
        self.slots = slots
        self.max_new_ids = max(MIN_NEW_IDS, NEW_IDS_PER_SLOT * slots)  # per attempt
        self.max_connections = max_connections
        self.hello_timeout_s = hello_timeout_s
        self.idle_timeout_s = 300.0 + IDLE_GRACE_S  # raised to the longest epoch timeout + grace
        # On the loop thread only:
        self._open: set[_Connection] = set()
        self._unproven: dict[_Connection, None] = {}  # not authenticated yet, oldest first
        self._waiting: dict[tuple[int, int], dict[tuple[str, str], _Connection]] = {}  # attempt -> vote -> slot
        self._warned: dict[str, tuple[float, int]] = {}  # kind -> (last logged, not logged since)
        family = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((bind_host, port), family=family, backlog=1024)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="eos-coordinator", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(lambda: _Connection(self), sock=sock), self._loop
        ).result()
        self.address = CoordinatorAddress(advertise_host, sock.getsockname()[1], self._key)

    def close(self) -> None:
        with self._lock:
            for state in self._attempts.values():
                state.closed = state.closed or "the driver stopped"
            self._lock.notify_all()
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shut_down(self) -> None:
        """Stop listening and close every connection: a slot still waiting reads the end of its
        connection, which means abort."""
        self._server.close()
        for connection in list(self._open):
            connection.close()

    # -- driver API: attempts ----------------------------------------------------------------
    def open_attempt(self, epoch: int, attempt: int, timeout_s: float) -> AttemptState:
        with self._lock:
            for key, old in self._attempts.items():  # only one attempt is ever current
                old.closed = old.closed or f"superseded by epoch {epoch} attempt {attempt}"
                self._tell(key)
            self._attempts = {k: v for k, v in self._attempts.items() if k[0] >= epoch - 1}
            state = AttemptState(epoch, attempt, time.monotonic() + timeout_s)
            self._attempts[(epoch, attempt)] = state
            self.idle_timeout_s = max(self.idle_timeout_s, timeout_s + IDLE_GRACE_S)
            return state

    def release(self, epoch: int, attempt: int, keys: list[tuple[str, str]]) -> None:
        """The decision is recorded: tell these (sink, handle) owners to commit."""
        with self._lock:
            state = self._attempts[(epoch, attempt)]
            state.released.update(keys)
            self._tell((epoch, attempt), keys)

    def wait_committed(self, epoch: int, attempt: int, keys: list[tuple[str, str]], timeout_s: float) -> list[str]:
        """Wait until the owners of `keys` report their commit; returns the problems (empty: all
        committed)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            state = self._attempts[(epoch, attempt)]
            state.watched, state.uncommitted, state.problems = set(keys), set(keys), {}
            for key in keys:  # what was reported before the wait; settle() keeps it up to date
                vote = state.votes.get(key)
                if vote is not None:
                    state.settle(key, vote)
            while True:
                if state.problems:
                    return [state.problems[k] for k in keys if k in state.problems]
                if not state.uncommitted:
                    return []
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [f"{k[0]} {k[1]}" for k in keys if k in state.uncommitted]
                    return [f"no commit report within {timeout_s:.0f} s from {', '.join(missing)}"]
                self._lock.wait(remaining)

    def close_attempt(self, epoch: int, attempt: int, reason: str) -> list[Vote]:
        """The attempt is over: every vote not told to commit is told to abort. Returns what must
        not linger: the votes never released, and, as votes with no handle, the ids leased to a
        task that never voted (it died, or Spark re-ran it elsewhere): their transactions may be
        open, and nobody will ever end them."""
        with self._lock:
            state = self._attempts.get((epoch, attempt))
            if state is None:
                return []
            state.closed = state.closed or reason
            self._tell((epoch, attempt))
            self._release_leases(state)
            strays = [v for k, v in state.votes.items() if k not in state.released]
            voted = {(v.sink, v.lease) for v in state.votes.values()}
            for sink, number in sorted(set(state.leases) - voted):
                strays.append(Vote(-1, sink, "", number, -1))
                if sink in self._pools:  # the driver fences it: whoever holds it must initialise again
                    self._pools[sink].owner.pop(number, None)
            return strays

    def votes(self, epoch: int, attempt: int) -> list[Vote]:
        with self._lock:
            state = self._attempts.get((epoch, attempt))
            return list(state.votes.values()) if state else []

    # -- driver API: leases ------------------------------------------------------------------
    def set_pools(self, sizes: dict[str, int]) -> None:
        """After recovery fenced every id: pools of these sizes, all unowned. Each slot keeps a
        connection per sink open while it waits for the decision, so the connection cap grows to
        twice slots x sinks when that passes it (1,024 is 256 slots x 4 sinks: docs/SCALING.md)."""
        with self._lock:
            self._pools = {sink: Pool(size) for sink, size in sizes.items()}
            self.max_connections = max(self.max_connections, 2 * self.slots * len(sizes))

    def pool_sizes(self) -> dict[str, int]:
        with self._lock:
            return {sink: pool.size for sink, pool in self._pools.items()}

    # -- decisions reach the waiting slots -----------------------------------------------------
    def _tell(self, attempt: tuple[int, int], keys: list[tuple[str, str]] | None = None) -> None:
        """A decision changed (under `_lock`): wake the driver, and answer the slots waiting for it
        (all of the attempt's, or those of `keys`) on the loop."""
        self._lock.notify_all()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._answer_waiting, attempt, keys)

    def _answer_waiting(self, attempt: tuple[int, int], keys: list[tuple[str, str]] | None) -> None:
        waiting = self._waiting.get(attempt, {})
        for key in list(waiting) if keys is None else [k for k in keys if k in waiting]:
            connection = waiting[key]
            assert connection.waiting is not None
            with self._lock:
                reply = self._decision(*connection.waiting)
            if reply is not None:
                del waiting[key]
                connection.answer(reply)
        if not waiting:
            self._waiting.pop(attempt, None)

    def _expire(self, attempt: tuple[int, int]) -> None:
        with self._lock:
            state = self._attempts.get(attempt)
            if state is not None and state.closed is None:
                state.closed = "timed out waiting for the decision"
                self._lock.notify_all()
        self._answer_waiting(attempt, None)

    def _decision(self, state: AttemptState, vote: Vote) -> dict[str, Any] | None:
        decision, reason = state.decision_for((vote.sink, vote.handle))
        if decision is None:
            return None
        vote.decision, vote.reason = decision, reason
        if decision == ABORT:
            self._free(state, vote.sink, vote.lease)
        return {"decision": decision, "reason": reason}

    # -- connections (on the loop) -----------------------------------------------------------
    def _admit(self, connection: _Connection) -> bool:
        if len(self._open) >= self.max_connections:
            oldest = next(iter(self._unproven), None)
            if oldest is None:
                self._warn("cap", f"{len(self._open)} connections are open, all authenticated, the most it keeps "
                           f"(max_connections): refusing one from {connection.peer}")  # fmt: skip
                connection.refuse("the vote service is at its connection cap")
                return False
            self._warn("cap", f"{len(self._open)} connections are open, the most it keeps (max_connections): "
                       f"closing the oldest not yet authenticated, from {oldest.peer}")  # fmt: skip
            oldest.close()
        self._open.add(connection)
        self._unproven[connection] = None
        return True

    def _gone(self, connection: _Connection) -> None:
        self._open.discard(connection)
        self._unproven.pop(connection, None)
        if connection.waiting is not None:  # its slot is gone: nobody will report its commit
            state, vote = connection.waiting
            self._waiting.get((state.epoch, state.attempt), {}).pop((vote.sink, vote.handle), None)

    def _warn(self, kind: str, message: str) -> None:
        """A log line per kind at most every 10 s (a flood of bad connections must not flood the
        log), saying how many were not logged."""
        now = time.monotonic()
        last, suppressed = self._warned.get(kind, (0.0, 0))
        if now - last < 10:
            self._warned[kind] = (last, suppressed + 1)
            return
        more = f" ({suppressed} more like it not logged)" if suppressed else ""
        log.warning("vote service: %s%s", message, more)
        self._warned[kind] = (now, 0)

    def _line(self, connection: _Connection, line: bytes) -> None:
        """One line from a peer: its hello, a ping, or an authenticated request."""
        if connection.session is None:
            peer_nonce = read_nonce(line)
            if peer_nonce is None:
                return connection.refuse("expected a hello")
            connection.session = Session(self._key, connection.nonce, peer_nonce, b"S")
            connection.peer_nonce = peer_nonce
            return None
        if connection in self._unproven and line.strip() == PING:
            return connection.close(self._prove(connection.nonce, connection.peer_nonce))
        try:
            request = connection.session.open(line)
        except ValueError:
            request = None
        if request is None:
            self._warn("auth", f"refused a message from {connection.peer}: not authenticated by this run")
            return connection.refuse("not authenticated by this run's key")
        self._unproven.pop(connection, None)
        try:
            reply = self._handle(connection, request)
        except Exception as exc:  # a malformed request must not kill the service
            log.warning("vote service: bad request from %s: %s", connection.peer, exc)
            reply = {"decision": ABORT, "error": f"bad request: {type(exc).__name__}: {exc}"}
        if reply is not None:  # else it waits for the decision
            connection.answer(reply)
        return None

    def _prove(self, nonce: bytes, peer_nonce: bytes) -> bytes:
        """The answer to a ping: proves this is the driver recorded with this ping key, for this
        pipeline and run, and says nothing else."""
        pipeline, run = str(self.identity.get("pipeline", "")), str(self.identity.get("run", ""))
        return b'{"proof": "%s"}\n' % proof(self.ping_key, nonce, peer_nonce, pipeline, run).encode()

    # -- requests (on the loop) --------------------------------------------------------------
    def _handle(self, connection: _Connection, request: dict[str, Any]) -> dict[str, Any] | None:
        op = request.get("op")
        key = (int(request["epoch"]), int(request["attempt"]))
        with self._lock:
            state = self._attempts.get(key)
            if state is None or (state.closed and op not in ("committed", "commit_failed")):
                reason = state.closed if state else "is not current"
                return {"decision": ABORT, "error": f"epoch {key[0]} attempt {key[1]}: {reason}"}
            if op == "lease":
                return self._lease(state, connection, request)
            vote_key = (str(request["sink"]), str(request["handle"]))
            if op in ("committed", "commit_failed"):
                return self._report(state, connection, vote_key, op, request)
            if op != "prepared":
                return {"decision": ABORT, "error": f"unexpected request {op!r}"}
            vote, refused = self._vote(state, connection, vote_key, request)
            if refused:
                return {"decision": ABORT, "error": refused}
            reply = self._decision(state, vote)
            if reply is not None:
                return reply
        # Waiting for the decision is no read: no timeout but the attempt's own.
        connection.wait(state, vote, state.deadline - time.monotonic())
        self._waiting.setdefault(key, {})[vote_key] = connection
        return None

    def _vote(
        self, state: AttemptState, connection: _Connection, key: tuple[str, str], request: dict[str, Any]
    ) -> tuple[Vote, str]:
        lease = request.get("lease")
        lease = None if lease is None else int(lease)
        vote = Vote(
            int(request["slot"]), key[0], key[1], lease, int(request.get("task_attempt", 0)),
            int(request.get("records", 0)), connection=connection,
        )  # fmt: skip
        if key in state.votes:
            # Two connections claim one transaction: one of them lies. The driver must not take
            # either's word that it committed: the attempt fails (and is replayed) instead.
            state.votes[key].error = state.votes[key].error or "two connections voted prepared for it"
            state.settle(key, state.votes[key])
            self._lock.notify_all()
            return vote, f"{key[0]} {key[1]}: already voted on another connection"
        if lease is not None and (state.epoch, state.attempt, key[0], lease) not in connection.leases:
            return vote, f"{key[0]}: id {lease} was not leased on this connection"
        state.votes[key] = vote
        state.settle(key, vote)
        self._lock.notify_all()
        return vote, ""

    def _report(
        self, state: AttemptState, connection: _Connection, key: tuple[str, str], op: str, request: dict[str, Any]
    ) -> dict[str, Any]:
        vote = state.votes.get(key)
        if vote is None or vote.connection is not connection:
            self._warn("report", f"refused `{op}` for {key[0]} {key[1]} from {connection.peer}: it did not vote")
            return {"ok": False, "error": f"{key[0]} {key[1]}: not voted on this connection"}
        vote.committed = op == "committed"
        if op == "commit_failed":
            vote.error = str(request.get("error", ""))[:500]
        state.settle(key, vote)
        self._free(state, vote.sink, vote.lease)
        # Wake the driver only when its wait can end: a report before the wait began (nothing
        # watched yet) is counted by the wait itself when it starts.
        if state.watched and (state.problems or not state.uncommitted):
            self._lock.notify_all()
        return {"ok": True}

    def _lease(self, state: AttemptState, connection: _Connection, request: dict[str, Any]) -> dict[str, Any]:
        sink, worker = str(request["sink"]), str(request["worker"])
        pool = self._pools.setdefault(sink, Pool())
        idle = [int(n) for n in request.get("idle", [])]
        stale = [n for n in idle if pool.owner.get(n) != worker]
        for n in idle:
            if n not in stale and n not in pool.busy:
                return self._grant(state, connection, sink, pool, n, fresh=False, stale=stale)
        free = [n for n in range(pool.size) if n not in pool.busy]
        unowned = [n for n in free if n not in pool.owner]
        if not free:
            # Double the pool (at least grow_step): each growth is a control-log transaction written
            # here on the loop, with every lease waiting behind it (256 slots x 4 sinks from empty
            # pools: 256 growths of 4, 3.5 s); doubling records a few per sink and never more than
            # twice what was busy at once. Within the attempt's allowance, else grow_step or refuse.
            step = max(self.grow_step, min(pool.size, self.max_new_ids - state.new_ids))
            if state.new_ids + step > self.max_new_ids:
                self._warn("lease", f"refused a lease for {sink} from {connection.peer}: the attempt added "
                           f"{state.new_ids} ids already")  # fmt: skip
                return {
                    "error": f"epoch {state.epoch} attempt {state.attempt} already added {state.new_ids} transactional "
                    f"ids to the pools, the most one attempt may add (max_new_ids: {self.max_new_ids}); recovery "
                    "fences every id ever used, so the pools do not grow without bound"
                }
            grown = {**self._sizes(), sink: pool.size + step}
            if self.on_grow is not None:
                self.on_grow(grown)  # durable before any new id is used; raises if fenced
            free = list(range(pool.size, pool.size + step))
            pool.size += step
            state.new_ids += step
            unowned = free
        number = (unowned or free)[0]
        pool.owner[number] = worker
        return self._grant(state, connection, sink, pool, number, fresh=True, stale=stale)

    def _grant(
        self, state: AttemptState, connection: _Connection, sink: str, pool: Pool, number: int, fresh: bool,
        stale: list[int],
    ) -> dict[str, Any]:  # fmt: skip
        pool.busy.add(number)
        state.leases[(sink, number)] = pool
        if len(connection.leases) > 64:  # a kept connection lives for the run: forget attempts no longer kept
            connection.leases = {lease for lease in connection.leases if lease[:2] in self._attempts}
        connection.leases.add((state.epoch, state.attempt, sink, number))
        return {"number": number, "fresh": fresh, "stale": stale}

    def _sizes(self) -> dict[str, int]:
        return {sink: pool.size for sink, pool in self._pools.items()}

    def _free(self, state: AttemptState, sink: str, lease: int | None) -> None:
        """Free an id this attempt leased, in the pool it leased it from: after a recovery the
        pools are new, and a late report of an old attempt must not free an id leased since."""
        pool = state.leases.get((sink, lease)) if lease is not None else None
        if pool is not None and pool is self._pools.get(sink):
            pool.busy.discard(lease)

    def _release_leases(self, state: AttemptState) -> None:
        """The attempt is over: its ids are free again, but those still committing (told to
        commit, no report yet): their owner frees them with its report."""
        committing = {(v.sink, v.lease) for k, v in state.votes.items() if k in state.released and not v.committed}
        for sink, number in set(state.leases) - committing:
            self._free(state, sink, number)


class _Connection(asyncio.BufferedProtocol):
    """One peer of the service, driven by the loop's callbacks (no thread, no task). It reads into
    one buffer of MAX_LINE bytes: a line that does not fit closes the connection, so a peer never
    makes the driver hold more than that. Requests are answered in order, one at a time: while a
    `prepared` vote waits for its decision, later lines wait in the buffer."""

    def __init__(self, service: Coordinator):
        self.service = service
        self.loop = service._loop
        self.buffer = bytearray(MAX_LINE)
        self.start = self.end = 0  # unread bytes: buffer[start:end]
        self.transport: Any = None
        self.peer = "?"
        self.nonce = secrets.token_bytes(16)
        self.peer_nonce = b""
        self.session: Session | None = None
        self.leases: set[tuple[int, int, str, int]] = set()  # (epoch, attempt, sink, id) leased here
        self.waiting: tuple[AttemptState, Vote] | None = None  # a `prepared` vote without its decision yet
        self.deadline = 0.0  # for the next line (loop time)
        self.timer: asyncio.TimerHandle | None = None  # reading (moved lazily, see expect_within)
        self.expiry: asyncio.TimerHandle | None = None  # the waiting vote's attempt times out
        self.closed = False

    # -- asyncio's callbacks -------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.service._admit(self):
            transport.write(service_hello(self.nonce))
            self.expect_within(self.service.hello_timeout_s)  # hello and first request

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.start:  # move what is unread to the front
            self.buffer[: self.end - self.start] = self.buffer[self.start : self.end]
            self.end -= self.start
            self.start = 0
        return memoryview(self.buffer)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        self.read_lines()
        if not self.closed and self.end - self.start == len(self.buffer):
            if self.buffer.find(b"\n", self.start, self.end) < 0:
                self.service._warn("long", f"closed a connection from {self.peer}: a line longer than {MAX_LINE} bytes")
                return self.refuse(f"a line longer than {MAX_LINE} bytes")
            self.transport.pause_reading()  # full of lines behind a vote: read on once it is answered
        return None

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.buffer = bytearray()  # its vote keeps this object as long as the attempt is kept
        self.start = self.end = 0
        for timer in (self.timer, self.expiry):
            if timer is not None:
                timer.cancel()
        self.service._gone(self)

    # -- the service's side --------------------------------------------------------------------
    def read_lines(self) -> None:
        while self.waiting is None and not self.closed:
            newline = self.buffer.find(b"\n", self.start, self.end)
            if newline < 0:
                return
            line = bytes(self.buffer[self.start : newline + 1])
            self.start = newline + 1
            self.service._line(self, line)

    def wait(self, state: AttemptState, vote: Vote, timeout_s: float) -> None:
        self.waiting = (state, vote)
        self.expiry = self.loop.call_later(max(0.0, timeout_s), self.service._expire, (state.epoch, state.attempt))

    def answer(self, reply: dict[str, Any]) -> None:
        assert self.session is not None
        if self.closed:
            return
        self.transport.write(self.session.seal(reply))
        if self.transport.get_write_buffer_size() > MAX_LINE:  # it sends and never reads
            return self.close()
        self.expect_within(self.service.idle_timeout_s)
        if self.waiting is not None:
            self.waiting = None
            if self.expiry is not None:
                self.expiry.cancel()
                self.expiry = None
            self.transport.resume_reading()
            self.read_lines()
        return None

    def expect_within(self, seconds: float) -> None:
        """The next line must arrive within `seconds`: one timer, moved only when it fires."""
        self.deadline = self.loop.time() + seconds
        if self.timer is None:
            self.timer = self.loop.call_at(self.deadline, self._check_time)

    def _check_time(self) -> None:
        self.timer = None
        if self.closed or self.waiting is not None:  # waiting for a decision is no read: answer() moves it
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._check_time)
            return
        self.service._warn("idle", f"closed a connection from {self.peer}: nothing to read in time")
        self.close()

    def refuse(self, why: str) -> None:
        """An unauthenticated refusal: it can only make the peer abort."""
        self.close(b'{"error": "refused: %s"}\n' % why.encode())

    def close(self, last: bytes = b"") -> None:
        if self.closed:
            return
        self.closed = True
        if last:
            self.transport.write(last)
        self.transport.close()
        self.service._gone(self)  # now: no longer counted while the transport finishes closing

"""Step 3, the vote: a small service in the driver that slots talk to over TCP (Flink's
JobManager role). It does three things:

- **Votes.** A slot whose transaction only its own producer can commit (Kafka) sends one
  `prepared` vote when its transaction is pre-committed, then leaves the connection with a
  thread of its Python worker and lets the task finish. The thread waits for the decision:
  `commit` once the driver has every slot's report and has recorded the decision, `abort`
  otherwise (the attempt failed, was superseded, or timed out). A stalled task of an aborted
  attempt that wakes up later is told `abort`; one whose driver died gets no answer at all: in
  neither case can it commit. Safety does not rest on this alone: recovery fences every
  transactional id before a new attempt reads the ledger.
- **Leases** of transactional identities. A sink's transactional ids are a numbered pool; the
  coordinator hands each slot an id its Python worker already holds idle (no `init_transactions`,
  no new producer: affinity between a producer and the process that keeps it), or else a free
  one to initialise. The pool only grows, and every growth is recorded durably (control log)
  before the id is used, so recovery can fence every id that ever held a transaction.
- **Liveness.** A new driver asks the previous driver's service whether it still runs before it
  takes the pipeline over (`ping`).

Wire format: one JSON object per line each way. Requests (but `ping`) carry the run token, a
secret of this driver run: votes from another run are refused. One round trip on loopback costs
well under a millisecond (Spark's BarrierTaskContext.allGather polls once a second).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("eos.coordinator")

COMMIT = "commit"
ABORT = "abort"


@dataclass(frozen=True)
class CoordinatorAddress:
    host: str
    port: int
    token: str

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"


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
    closed: str | None = None  # why the attempt ended; undecided votes are aborted
    opened_at: float = field(default_factory=time.monotonic)

    def decision_for(self, key: tuple[str, str]) -> tuple[str | None, str]:
        if key in self.released:
            return COMMIT, ""
        if self.closed is not None:
            return ABORT, self.closed
        return None, ""


class Coordinator:
    """The driver side. Thread-safe; serves on a background thread."""

    def __init__(
        self,
        bind_host: str = "0.0.0.0",
        port: int = 0,
        advertise_host: str = "127.0.0.1",
        identity: dict[str, Any] | None = None,
    ):
        self.token = secrets.token_hex(16)
        self.identity = {"pid": os.getpid(), "host": socket.gethostname(), **(identity or {})}
        self._lock = threading.Condition()
        self._attempts: dict[tuple[int, int], AttemptState] = {}
        self._pools: dict[str, Pool] = {}
        self.on_grow: Callable[[dict[str, int]], None] | None = None  # records pool sizes durably
        self.grow_step = 4
        coordinator = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    try:
                        reply = coordinator._handle(json.loads(line))
                    except Exception as exc:  # a malformed request must not kill the service
                        log.warning("vote service: bad request: %s", exc)
                        reply = {"decision": ABORT, "error": f"bad request: {exc}"}
                    self.wfile.write(json.dumps(reply).encode() + b"\n")
                    self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((bind_host, port), Handler)
        self.address = CoordinatorAddress(advertise_host, self._server.server_address[1], self.token)
        # serve_forever checks for shutdown() between polls: 0.5 s by default, paid at every stop
        # (here ~5 ms on average, for ~100 idle wake-ups a second of a thread that does nothing).
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), name="eos-coordinator", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            for state in self._attempts.values():
                state.closed = state.closed or "the driver stopped"
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- driver API: attempts ----------------------------------------------------------------
    def open_attempt(self, epoch: int, attempt: int, timeout_s: float) -> AttemptState:
        with self._lock:
            for old in self._attempts.values():  # only one attempt is ever current
                old.closed = old.closed or f"superseded by epoch {epoch} attempt {attempt}"
            self._attempts = {k: v for k, v in self._attempts.items() if k[0] >= epoch - 1}
            state = AttemptState(epoch, attempt, time.monotonic() + timeout_s)
            self._attempts[(epoch, attempt)] = state
            self._lock.notify_all()
            return state

    def release(self, epoch: int, attempt: int, keys: list[tuple[str, str]]) -> None:
        """The decision is recorded: tell these (sink, handle) owners to commit."""
        with self._lock:
            state = self._attempts[(epoch, attempt)]
            state.released.update(keys)
            self._lock.notify_all()

    def wait_committed(self, epoch: int, attempt: int, keys: list[tuple[str, str]], timeout_s: float) -> list[str]:
        """Wait until the owners of `keys` report their commit; returns the problems (empty: all
        committed)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            state = self._attempts[(epoch, attempt)]
            while True:
                votes = [state.votes.get(k) for k in keys]
                problems = [
                    f"{k[0]} {k[1]}: {v.error}" for k, v in zip(keys, votes, strict=True) if v is not None and v.error
                ]
                if problems:
                    return problems
                if all(v is not None and v.committed for v in votes):
                    return []
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pending = zip(keys, votes, strict=True)
                    missing = [f"{k[0]} {k[1]}" for k, v in pending if v is None or not v.committed]
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
            self._lock.notify_all()
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
        """After recovery fenced every id: pools of these sizes, all unowned."""
        with self._lock:
            self._pools = {sink: Pool(size) for sink, size in sizes.items()}

    def pool_sizes(self) -> dict[str, int]:
        with self._lock:
            return {sink: pool.size for sink, pool in self._pools.items()}

    # -- requests ----------------------------------------------------------------------------
    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"alive": True, **self.identity}
        if request.get("token") != self.token:
            return {"decision": ABORT, "error": "unknown run (a stale task of another driver?)"}
        key = (int(request["epoch"]), int(request["attempt"]))
        with self._lock:
            state = self._attempts.get(key)
            if state is None or (state.closed and op not in ("committed", "commit_failed")):
                reason = state.closed if state else "is not current"
                return {"decision": ABORT, "error": f"epoch {key[0]} attempt {key[1]}: {reason}"}
            if op == "lease":
                return self._lease(state, request)
            vote_key = (request["sink"], request["handle"])
            if op == "prepared":
                return self._await_decision(state, vote_key, request)
            if op in ("committed", "commit_failed"):
                vote = state.votes.get(vote_key)
                if vote is not None:
                    vote.committed = op == "committed"
                    vote.error = request.get("error", "") if op == "commit_failed" else ""
                    self._free(state, vote.sink, vote.lease)
                self._lock.notify_all()
                return {"ok": True}
        return {"decision": ABORT, "error": f"unexpected request {op!r}"}

    def _await_decision(self, state: AttemptState, key: tuple[str, str], request: dict[str, Any]) -> dict[str, Any]:
        vote = Vote(
            int(request["slot"]), key[0], key[1], request.get("lease"), int(request.get("task_attempt", 0)),
            int(request.get("records", 0)),
        )  # fmt: skip
        state.votes[key] = vote
        self._lock.notify_all()
        while True:
            decision, reason = state.decision_for(key)
            if decision is not None:
                vote.decision, vote.reason = decision, reason
                if decision == ABORT:
                    self._free(state, vote.sink, vote.lease)
                return {"decision": decision, "reason": reason}
            remaining = state.deadline - time.monotonic()
            if remaining <= 0:
                state.closed = state.closed or "timed out waiting for the decision"
                continue
            self._lock.wait(remaining)

    def _lease(self, state: AttemptState, request: dict[str, Any]) -> dict[str, Any]:
        sink, worker = request["sink"], request["worker"]
        pool = self._pools.setdefault(sink, Pool())
        idle = [int(n) for n in request.get("idle", [])]
        stale = [n for n in idle if pool.owner.get(n) != worker]
        for n in idle:
            if n not in stale and n not in pool.busy:
                pool.busy.add(n)
                state.leases[(sink, n)] = pool
                return {"number": n, "fresh": False, "stale": stale}
        free = [n for n in range(pool.size) if n not in pool.busy]
        unowned = [n for n in free if n not in pool.owner]
        if not free:
            grown = {**self.pool_sizes_unlocked(), sink: pool.size + self.grow_step}
            if self.on_grow is not None:
                self.on_grow(grown)  # durable before any new id is used; raises if fenced
            free = list(range(pool.size, pool.size + self.grow_step))
            pool.size += self.grow_step
            unowned = free
        number = (unowned or free)[0]
        pool.owner[number] = worker
        pool.busy.add(number)
        state.leases[(sink, number)] = pool
        return {"number": number, "fresh": True, "stale": stale}

    def pool_sizes_unlocked(self) -> dict[str, int]:
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


# ---------------------------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------------------------


class VoteClient:
    """One connection from a slot to the coordinator."""

    def __init__(self, address: CoordinatorAddress, epoch: int, attempt: int, timeout_s: float):
        self.address, self.epoch, self.attempt, self.timeout_s = address, epoch, attempt, timeout_s
        self._sock: socket.socket | None = None
        self._file: Any = None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        message = {"op": op, "token": self.address.token, "epoch": self.epoch, "attempt": self.attempt, **fields}
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.address.host, self.address.port), timeout=10)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._file = self._sock.makefile("rwb")
            self._sock.settimeout(self.timeout_s + 10)
            self._file.write(json.dumps(message).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        except OSError as exc:
            return {"decision": ABORT, "error": f"vote service unreachable: {exc}"}
        if not line:
            return {"decision": ABORT, "error": "the vote service closed the connection"}
        return json.loads(line)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def ping(hostport: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """Whether a driver's vote service answers at host:port (its identity), else None."""
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b'{"op": "ping"}\n')
            line = sock.makefile("rb").readline()
    except (OSError, ValueError):
        return None
    try:
        reply = json.loads(line)
    except json.JSONDecodeError:
        return None
    return reply if reply.get("alive") else None

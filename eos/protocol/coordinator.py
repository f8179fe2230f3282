"""The slots' agreement: a small vote service in the driver (Flink's JobManager role).

Each sink slot, once its transactions are pre-committed (produced, ledger record written,
flushed), sends one `prepared` vote and waits for the decision. When every slot of the attempt
has voted `prepared`, the decision is `commit`; a `failed` vote, a timeout, or the driver
closing the attempt makes it `abort`. One round trip on loopback costs well under a
millisecond, where Spark's `BarrierTaskContext.allGather` polls once a second.

Why in the driver and not a Kafka control topic: the decision is made in one place that knows
which attempt is current. A stalled task of an aborted attempt that wakes up later is told
`abort`, and a task whose driver died gets no answer at all, so neither can commit. Safety
does not rest on this alone: every attempt re-fences the transactional ids first (I5).

Wire format: one JSON object per line each way. Every request carries the run token, a random
secret of this driver process, so votes from another run (or anything else) are refused.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("eos.protocol.coordinator")

COMMIT = "commit"
ABORT = "abort"


@dataclass
class AttemptState:
    epoch: int
    attempt: int
    slots: frozenset[int]
    deadline: float
    ordered_commit: bool = False  # commit slot by slot, lowest first (failpoint "between commits")
    prepared: dict[int, dict[str, Any]] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    decision: str | None = None
    reason: str = ""
    opened_at: float = field(default_factory=time.monotonic)
    first_vote_at: float | None = None
    last_vote_at: float | None = None
    decided_at: float | None = None

    def decide(self, decision: str, reason: str = "") -> None:
        if self.decision is None:
            self.decision, self.reason, self.decided_at = decision, reason, time.monotonic()


@dataclass(frozen=True)
class CoordinatorAddress:
    host: str
    port: int
    token: str


class Coordinator:
    """The driver side. Thread-safe; serves votes on a background thread."""

    def __init__(self, bind_host: str = "0.0.0.0", port: int = 0, advertise_host: str = "127.0.0.1"):
        self.token = secrets.token_hex(16)
        self._lock = threading.Condition()
        self._attempts: dict[tuple[int, int], AttemptState] = {}
        coordinator = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    try:
                        reply = coordinator._handle(json.loads(line))
                    except Exception as exc:  # a malformed request must not kill the service
                        reply = {"decision": ABORT, "reason": f"bad request: {exc}"}
                    self.wfile.write(json.dumps(reply).encode() + b"\n")
                    self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((bind_host, port), Handler)
        self.address = CoordinatorAddress(advertise_host, self._server.server_address[1], self.token)
        self._thread = threading.Thread(target=self._server.serve_forever, name="eos-coordinator", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            for state in self._attempts.values():
                state.decide(ABORT, "coordinator closed")
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- driver API --------------------------------------------------------------------------
    def open_attempt(
        self, epoch: int, attempt: int, slots: Iterable[int], timeout_s: float, ordered_commit: bool = False
    ) -> AttemptState:
        state = AttemptState(epoch, attempt, frozenset(slots), time.monotonic() + timeout_s, ordered_commit)
        with self._lock:
            # Only one attempt is ever current: everything older is aborted now.
            for old in self._attempts.values():
                old.decide(ABORT, f"superseded by epoch {epoch} attempt {attempt}")
            self._attempts = {k: v for k, v in self._attempts.items() if k[0] >= epoch - 1}
            self._attempts[(epoch, attempt)] = state
            self._lock.notify_all()
        return state

    def attempt_state(self, epoch: int, attempt: int) -> AttemptState | None:
        with self._lock:
            return self._attempts.get((epoch, attempt))

    def close_attempt(self, epoch: int, attempt: int, reason: str) -> None:
        """The driver gave up on the attempt (or it finished): undecided slots are told abort."""
        with self._lock:
            state = self._attempts.get((epoch, attempt))
            if state is not None:
                state.decide(ABORT, reason)
                self._lock.notify_all()

    # -- vote handling -----------------------------------------------------------------------
    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("token") != self.token:
            return {"decision": ABORT, "reason": "unknown run (stale task of another driver?)"}
        key = (int(request["epoch"]), int(request["attempt"]))
        slot = int(request["slot"])
        op = request["op"]
        with self._lock:
            state = self._attempts.get(key)
            if state is None:
                return {"decision": ABORT, "reason": f"epoch {key[0]} attempt {key[1]} is not current"}
            if op == "committed":
                state.committed.add(slot)
                self._lock.notify_all()
                return {"ok": True}
            now = time.monotonic()
            if op == "failed":
                state.decide(ABORT, f"slot {slot} failed: {request.get('error', '?')}")
                self._lock.notify_all()
            elif op == "prepared" and slot in state.slots:
                state.prepared[slot] = request.get("info", {})
                state.first_vote_at = state.first_vote_at or now
                state.last_vote_at = now
                if set(state.prepared) == set(state.slots):
                    state.decide(COMMIT)
                self._lock.notify_all()
            else:
                return {"decision": ABORT, "reason": f"unexpected {op} from slot {slot}"}
            while state.decision is None or self._must_wait_turn(state, slot):
                remaining = state.deadline - time.monotonic()
                if remaining <= 0:
                    if state.decision == COMMIT:  # still waiting for its turn in an ordered commit
                        return {"decision": ABORT, "reason": "timed out waiting for lower slots to commit"}
                    missing = sorted(state.slots - set(state.prepared))
                    state.decide(ABORT, f"timed out waiting for slots {missing}")
                    self._lock.notify_all()
                    break
                self._lock.wait(remaining)
            return {"decision": state.decision, "reason": state.reason}

    @staticmethod
    def _must_wait_turn(state: AttemptState, slot: int) -> bool:
        """With ordered commits, a slot commits only after every lower slot has committed."""
        if not state.ordered_commit or state.decision != COMMIT:
            return False
        return any(s < slot and s not in state.committed for s in state.slots)


# ---------------------------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------------------------


class VoteClient:
    """A slot's connection to the coordinator; lives for one task."""

    def __init__(self, address: CoordinatorAddress, epoch: int, attempt: int, slot: int, timeout_s: float):
        self.address, self.epoch, self.attempt, self.slot = address, epoch, attempt, slot
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._file: Any = None

    def _request(self, op: str, **extra: Any) -> dict[str, Any]:
        message = {"op": op, "token": self.address.token, "epoch": self.epoch, "attempt": self.attempt,
                   "slot": self.slot, **extra}  # fmt: skip
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.address.host, self.address.port), timeout=10)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._file = self._sock.makefile("rwb")
            self._sock.settimeout(self.timeout_s + 5)
            self._file.write(json.dumps(message).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        except OSError as exc:
            return {"decision": ABORT, "reason": f"coordinator unreachable: {exc}"}
        if not line:
            return {"decision": ABORT, "reason": "coordinator closed the connection"}
        return json.loads(line)

    def vote_prepared(self, info: dict[str, Any]) -> tuple[str, str]:
        reply = self._request("prepared", info=info)
        return reply.get("decision", ABORT), reply.get("reason", "")

    def vote_failed(self, error: str) -> None:
        self._request("failed", error=error[:500])

    def report_committed(self) -> None:
        self._request("committed")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

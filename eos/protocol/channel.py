"""The vote service's channel: how a slot talks to its driver (eos.protocol.coordinator), and how
a new driver asks the previous one whether it still runs. Both ends live here; the task side
imports only this module.

One line per message each way, at most MAX_LINE bytes with its newline:

    service -> peer, on connect:   {"eos": "vote/1", "nonce": "<32 hex>"}
    peer -> service, on connect:   {"nonce": "<32 hex>"}
    then each request and reply:   <32 hex: MAC> <JSON object>

The run key (random, one per driver run) reaches the tasks inside the pickled EpochPlan, the way
Spark ships every task's closure, and never crosses the vote service's connection. Each
connection has a key of its own, HMAC-SHA256(run key, "eos vote" + service nonce + peer nonce),
so a message recorded on one connection means nothing on another. A message's MAC is HMAC-SHA256
under the connection key of its direction (C or S), its number on the connection and its JSON,
truncated to 128 bits: a message replayed, dropped or reordered on the same connection fails its
check too. Replies are checked the same way: a slot commits only on a `commit` from its driver.

Liveness (`ping`) is a challenge instead of a request: the peer's nonce is the challenge, it sends
{"op": "ping"}, and the service answers {"proof": HMAC-SHA256(ping key, "eos ping" + nonces +
pipeline + run)}. The ping key is a second secret of the run, recorded with the driver in the
control log (eos.protocol.decision.DriverInfo): only the recorded driver can prove it is alive,
and a stranger who pings learns nothing it did not send.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import json
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from eos.protocol.decision import DriverInfo

COMMIT = "commit"
ABORT = "abort"
VERSION = "vote/1"
# The largest message is a lease naming the worker's idle ids (at most MAX_IDLE, ~8 KiB); 16 KiB
# leaves room for long names, and is what a peer can make the driver hold per connection.
MAX_LINE = 16 * 1024
MAX_IDLE = 1000
_MAC_HEX = 32  # 128-bit tags


def new_key() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class CoordinatorAddress:
    """Where the slots reach the vote service, and the run key (pickled into the tasks)."""

    host: str
    port: int
    key: str = field(repr=False)

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"


class Session:
    """One connection's MACs, for the end that sends `sending` (b"C": the peer, b"S": the service)."""

    def __init__(self, key: str, service_nonce: bytes, peer_nonce: bytes, sending: bytes):
        self._key = hmac.digest(key.encode(), b"eos vote\0" + service_nonce + peer_nonce, "sha256")
        self._sending, self._receiving = sending, (b"S" if sending == b"C" else b"C")
        self._sent = self._received = 0

    def seal(self, message: dict[str, Any]) -> bytes:
        body = json.dumps(message).encode()
        tag = self._tag(self._sending, self._sent, body)
        self._sent += 1
        return tag + b" " + body + b"\n"

    def open(self, line: bytes) -> dict[str, Any] | None:
        """The message if its MAC holds (then it is the next one of the connection), else None."""
        tag, _, body = line.rstrip(b"\n").partition(b" ")
        if not hmac.compare_digest(tag, self._tag(self._receiving, self._received, body)):
            return None
        self._received += 1
        message = json.loads(body)
        return message if isinstance(message, dict) else None

    def _tag(self, direction: bytes, number: int, body: bytes) -> bytes:
        # hmac.digest: OpenSSL's one-shot HMAC, ~1 us (an hmac.new(...).copy() costs ~10)
        return hmac.digest(self._key, direction + number.to_bytes(8, "big") + body, "sha256").hex()[:_MAC_HEX].encode()


def service_hello(nonce: bytes) -> bytes:
    return json.dumps({"eos": VERSION, "nonce": nonce.hex()}).encode() + b"\n"


def peer_hello(nonce: bytes) -> bytes:
    return json.dumps({"nonce": nonce.hex()}).encode() + b"\n"


def read_nonce(line: bytes) -> bytes | None:
    """The nonce of a hello line, or None if the line is not one."""
    try:
        hello = json.loads(line)
        nonce = bytes.fromhex(hello["nonce"])
    except (ValueError, TypeError, KeyError):
        return None
    return nonce if len(nonce) == 16 else None


def proof(ping_key: str, service_nonce: bytes, peer_nonce: bytes, pipeline: str, run: str) -> str:
    message = b"eos ping\0" + service_nonce + peer_nonce + f"{pipeline}\0{run}".encode()
    return hmac.digest(ping_key.encode(), message, "sha256").hex()


# ---------------------------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------------------------


class VoteClient:
    """One conversation of a slot with the vote service (a lease, a vote, a commit report). Every
    answer it returns is authenticated; anything else (unreachable, refused, a forged or garbled
    reply) comes back as an abort. Its connection comes from this process's idle ones to the same
    service and run (KEPT) when there is one, and goes back there when the conversation ends after
    an answer; a connection that failed is closed instead."""

    def __init__(self, address: CoordinatorAddress, epoch: int, attempt: int, timeout_s: float):
        self.address, self.epoch, self.attempt, self.timeout_s = address, epoch, attempt, timeout_s
        self._link: _Link | None = None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        message = {"op": op, "epoch": self.epoch, "attempt": self.attempt, **fields}
        try:
            if self._link is None:
                self._link = KEPT.take(self.address) or _Link.connect(self.address)
            link = self._link
            line = link.session.seal(message)
            if len(line) > MAX_LINE:
                return {"decision": ABORT, "error": f"request of {len(line)} bytes: the vote service takes {MAX_LINE}"}
            link.sock.settimeout(self.timeout_s + 10)  # `prepared` waits up to the epoch's timeout
            link.file.write(line)
            link.file.flush()
            answer = link.file.readline(MAX_LINE)
        except (OSError, ValueError) as exc:
            self._drop()
            return {"decision": ABORT, "error": f"vote service unreachable: {exc}"}
        reply = link.session.open(answer) if answer.endswith(b"\n") else None
        if reply is None:
            self._drop()
            return {"decision": ABORT, "error": f"the vote service refused the request or closed: {_refusal(answer)}"}
        return reply

    def close(self) -> None:
        """The conversation is over: its connection, answered and idle, is kept for the next one."""
        if self._link is not None:
            KEPT.give(self.address, self._link)
        self._link = None

    def _drop(self) -> None:
        if self._link is not None:
            self._link.close()
        self._link = None


@dataclass
class _Link:
    """An authenticated connection to the vote service."""

    sock: socket.socket
    file: Any
    session: Session

    @classmethod
    def connect(cls, address: CoordinatorAddress) -> _Link:
        sock = socket.create_connection((address.host, address.port), timeout=10)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            file = sock.makefile("rwb")
            nonce = secrets.token_bytes(16)
            file.write(peer_hello(nonce))
            file.flush()
            service_nonce = read_nonce(file.readline(MAX_LINE))
        except BaseException:
            sock.close()
            raise
        if service_nonce is None:
            sock.close()
            raise ConnectionError(f"{address.hostport} is not an eos vote service")
        return cls(sock, file, Session(address.key, service_nonce, nonce, b"C"))

    def idle(self) -> bool:
        """Still open, with nothing unread: the service closes a connection idle for longer than
        its epoch timeout plus a minute (and every one when its driver stops)."""
        try:
            self.sock.setblocking(False)
            try:
                self.sock.recv(1, socket.MSG_PEEK)  # b"": closed; anything else: not an idle connection
                return False
            except BlockingIOError:
                return True
            finally:
                self.sock.setblocking(True)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()


class _Kept:
    """This process's idle connections to vote services, by service and run (the address holds the
    run key: a new driver run never gets an old run's connection). A Python worker runs one task
    at a time, and a task's conversations (one per sink it writes) end within its epoch, so what is
    kept is at most what the worker had open at once, at most KEEP per service. Each conversation
    on a kept connection saves the driver a connection's accept, hello and close: 37% of its CPU
    per epoch at 256 slots (docs/SCALING.md). A forked process starts without any."""

    KEEP = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[CoordinatorAddress, list[_Link]] = {}

    def take(self, address: CoordinatorAddress) -> _Link | None:
        with self._lock:
            self._forked()
            links = self._idle.get(address, [])
            while links:
                link = links.pop()
                if link.idle():
                    return link
                link.close()
        return None

    def give(self, address: CoordinatorAddress, link: _Link) -> None:
        with self._lock:
            self._forked()
            for other in [a for a in self._idle if a != address and a.hostport == address.hostport]:
                for stale in self._idle.pop(other):  # a run that ended: its driver is gone
                    stale.close()
            links = self._idle.setdefault(address, [])
            if len(links) < self.KEEP:
                links.append(link)
                return
        link.close()

    def _forked(self) -> None:
        if os.getpid() != self._pid:  # the parent's connections are the parent's
            self._pid, self._idle = os.getpid(), {}


KEPT = _Kept()


def _refusal(line: bytes) -> str:
    """What an unauthenticated refusal says (it can only make a slot abort, never commit)."""
    try:
        return str(json.loads(line).get("error"))[:200]
    except (ValueError, AttributeError):
        return "no answer" if not line else "an answer that is not from this run's driver"


# ---------------------------------------------------------------------------------------------
# Liveness
# ---------------------------------------------------------------------------------------------


class Liveness(enum.Enum):
    ALIVE = "the recorded driver answers"
    SILENT = "nothing answers"
    OTHER = "something answers, but cannot prove it is the recorded driver"


def ping(driver: DriverInfo, timeout_s: float = 3.0) -> Liveness:
    """Whether the recorded driver's vote service answers at its address, proving it is that
    driver (its pipeline, its run, its ping key)."""
    host, _, port = driver.address.rpartition(":")
    challenge = secrets.token_bytes(16)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(peer_hello(challenge) + b'{"op": "ping"}\n')
            answers = sock.makefile("rb")
            service_nonce = read_nonce(answers.readline(MAX_LINE))
            line = answers.readline(MAX_LINE)
    except (OSError, ValueError):  # refused, timed out, or no address at all
        return Liveness.SILENT
    if not line:
        return Liveness.SILENT if service_nonce is None else Liveness.OTHER
    try:
        answer = json.loads(line)
        given = answer.get("proof") if isinstance(answer, dict) else None
    except ValueError:
        given = None
    if service_nonce is None or not driver.ping_key or not isinstance(given, str):
        return Liveness.OTHER
    expected = proof(driver.ping_key, service_nonce, challenge, driver.pipeline, driver.run)
    return Liveness.ALIVE if hmac.compare_digest(given, expected) else Liveness.OTHER

"""Fencing many transactional ids over a few connections: what Kafka's Java Admin.fenceProducers
(KIP-664) does, which librdkafka lacks.

A librdkafka producer serves one transactional id, and fencing it by `init_transactions` costs
three TCP connections (bootstrap, broker, transaction coordinator: with TLS and SASL, three
handshakes), three ApiVersions, three Metadata, a FindCoordinator and, last, the one request that
fences: InitProducerId. On the local broker that is ~3 ms of the driver's CPU and ~4 ms of the
broker's per id, so recovery's fencing of 1,024 ids took 7 s of CPU (docs/SCALING.md). Here each
coordinator gets one connection, one batched FindCoordinator (v4) finds every id's coordinator, and
the InitProducerId requests (producer id and epoch -1: a fresh initialisation, the same request
`init_transactions` sends first) go down those connections in windows: one request per id.

What an InitProducerId does is what `init_transactions` relies on: the coordinator bumps the
id's producer epoch (every earlier producer of the id is fenced) and, if the id has a transaction
open, aborts it and answers CONCURRENT_TRANSACTIONS until the abort is complete; the request is
then sent again, and only its success counts. So an id counts as fenced exactly when a librdkafka
`init_transactions` on it would have returned.

Only settings this module implements in full take this path (WIRE_SETTINGS: PLAINTEXT, SSL with
PEM files, SASL PLAIN and SCRAM-SHA-256/512); a client with any other setting (GSSAPI,
OAUTHBEARER, keystores, inline PEM, cipher lists, ...) is fenced by librdkafka producers as
before (eos_connectors.kafka.ledger), so no security setting can be dropped on the way. TLS
verifies the broker's certificate and host name unless the client's settings turn that off, as
librdkafka does; SCRAM checks the broker's signature. No secret reaches a log or an error.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

# Settings whose meaning this module implements (security ones), or that do not change what a
# fencing connection does (the rest: producer tuning, eos's own defaults). Anything else sends the
# client to librdkafka.
SECURITY_SETTINGS = frozenset({
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "enable.ssl.certificate.verification", "ssl.endpoint.identification.algorithm", "client.id",
})  # fmt: skip
INERT_SETTINGS = frozenset({
    "logger", "transactional.id", "enable.sparse.connections", "reconnect.backoff.max.ms", "reconnect.backoff.ms",
    "partitioner", "linger.ms", "acks", "enable.idempotence", "compression.type", "compression.codec",
    "batch.size", "batch.num.messages", "queue.buffering.max.ms", "queue.buffering.max.messages",
    "queue.buffering.max.kbytes", "message.max.bytes", "transaction.timeout.ms", "socket.timeout.ms",
    "request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms", "retries", "retry.backoff.ms",
    "statistics.interval.ms", "socket.nagle.disable", "socket.keepalive.enable", "api.version.request",
})  # fmt: skip
WIRE_SETTINGS = SECURITY_SETTINGS | INERT_SETTINGS
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = {"PLAIN": None, "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

# Protocol: API keys, error codes (Kafka's protocol guide).
API_VERSIONS, FIND_COORDINATOR, INIT_PRODUCER_ID, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 10, 22, 17, 36
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 14, 15, 16
CONCURRENT_TRANSACTIONS = 51
REFUSED = frozenset({31, 53})  # CLUSTER_ / TRANSACTIONAL_ID_AUTHORIZATION_FAILED
RETRY = frozenset({COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS})
REFIND = frozenset({COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR})
# Connections per coordinator: a broker handles one request of a connection at a time, so a few
# connections let it use more than one of its request threads (1,024 ids on the loaded local broker:
# median 0.32 s with one, 0.23 s with four, 0.32 s with eight).
STRIPES = 4
WINDOW = 256  # requests in flight per connection (~90 bytes each; answers are ~30 bytes)
# The timeout the coordinator appends the new epoch with (no transaction is started with it), as
# Kafka's Admin.fenceProducers uses (its request.timeout.ms, KAFKA-16047).
TXN_TIMEOUT_MS = 30_000


class Unsupported(Exception):
    """These settings, or this cluster, need librdkafka's producers (the caller falls back)."""


class WireError(Exception):
    """The wire path failed (unreachable, authentication, an unexpected answer): the caller falls back."""


@dataclass(frozen=True)
class Settings:
    brokers: tuple[tuple[str, int], ...]
    protocol: str
    client_id: str
    mechanism: str = ""
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    tls: ssl.SSLContext | None = field(default=None, repr=False)


def wire_settings(config: Mapping[str, Any]) -> Settings:
    """The wire path's view of a client's settings; Unsupported if any of them is not implemented here."""
    unknown = sorted(set(config) - WIRE_SETTINGS)
    if unknown:
        raise Unsupported(f"settings {', '.join(unknown)}")
    protocol = str(config.get("security.protocol", "plaintext")).upper()
    if protocol not in PROTOCOLS:
        raise Unsupported(f"security.protocol {protocol}")
    mechanism = ""
    if protocol.startswith("SASL"):
        mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI").upper()
        if mechanism not in MECHANISMS or not config.get("sasl.username"):
            raise Unsupported(f"sasl.mechanism {mechanism}")
    tls = _tls_context(config) if protocol.endswith("SSL") else None
    return Settings(
        brokers=tuple(_address(one) for one in str(config.get("bootstrap.servers", "")).split(",") if one.strip()),
        protocol=protocol,
        client_id=str(config.get("client.id", "eos-fencer")),
        mechanism=mechanism,
        username=str(config.get("sasl.username", "")),
        password=str(config.get("sasl.password", "")),
        tls=tls,
    )


def _address(text: str) -> tuple[str, int]:
    text = text.strip().split("://")[-1]
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise Unsupported(f"bootstrap address {text!r}")
    return host.strip("[]"), int(port)


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    return str(value).strip().lower() in ("true", "1", "yes")


def _tls_context(config: Mapping[str, Any]) -> ssl.SSLContext:
    """librdkafka's TLS settings as Python's: the broker's certificate verified against
    ssl.ca.location (else the system's CAs), its host name checked unless
    ssl.endpoint.identification.algorithm is none, and a client certificate if one is set."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if _flag(config.get("enable.ssl.certificate.verification"), True):
        ca = config.get("ssl.ca.location")
        if ca is None:
            context.load_default_certs()
        elif os.path.isfile(str(ca)):
            context.load_verify_locations(cafile=str(ca))
        elif os.path.isdir(str(ca)):
            context.load_verify_locations(capath=str(ca))
        else:  # "probe" and other librdkafka spellings
            raise Unsupported("ssl.ca.location")
        context.check_hostname = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower() == "https"
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.get("ssl.certificate.location"):
        context.load_cert_chain(
            str(config["ssl.certificate.location"]),
            str(config.get("ssl.key.location") or config["ssl.certificate.location"]),
            password=config.get("ssl.key.password"),
        )
    return context


# ---------------------------------------------------------------------------------------------
# Encoding (flexible versions: compact strings and arrays, tagged fields)
# ---------------------------------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def compact_string(text: str | None) -> bytes:
    if text is None:
        return uvarint(0)
    data = text.encode()
    return uvarint(len(data) + 1) + data


def string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


class Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def compact_string(self) -> str | None:
        n = self.uvarint()
        if n == 0:
            return None
        text = self.data[self.at : self.at + n - 1].decode()
        self.at += n - 1
        return text

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        text = self.data[self.at : self.at + n].decode()
        self.at += n
        return text

    def bytes_(self) -> bytes:
        n = self.take(">i")
        data = self.data[self.at : self.at + max(0, n)]
        self.at += max(0, n)
        return data

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()


def find_coordinator_body(txids: list[str]) -> bytes:
    """FindCoordinator v4: key type 1 (transaction), the ids, no tags."""
    return b"\x01" + uvarint(len(txids) + 1) + b"".join(compact_string(t) for t in txids) + b"\x00"


def parse_coordinators(reader: Reader) -> dict[str, tuple[int, str, int, int]]:
    """id -> (node, host, port, error) from a FindCoordinator v4 answer."""
    reader.take(">i")  # throttle
    found = {}
    for _ in range(reader.uvarint() - 1):
        key = reader.compact_string() or ""
        node, host = reader.take(">i"), reader.compact_string() or ""
        port, error = reader.take(">ih")
        reader.compact_string()
        reader.tags()
        found[key] = (node, host, port, error)
    reader.tags()
    return found


def init_producer_id_body(txid: str, version: int) -> bytes:
    """InitProducerId v2-v4: a fresh initialisation (producer id and epoch -1 from v3 on)."""
    body = compact_string(txid) + struct.pack(">i", TXN_TIMEOUT_MS)
    if version >= 3:
        body += struct.pack(">qh", -1, -1)
    return body + b"\x00"


def parse_init_producer_id(reader: Reader) -> int:
    """The error code of an InitProducerId answer (0: fenced)."""
    _throttle, error = reader.take(">ih")
    return int(error)


# ---------------------------------------------------------------------------------------------
# SCRAM (RFC 5802): the client's two messages, and the check of the server's signature
# ---------------------------------------------------------------------------------------------


class Scram:
    def __init__(self, hash_name: str, username: str, password: str, nonce: str | None = None):
        self.hash_name, self.password = hash_name, password
        name = username.replace("=", "=3D").replace(",", "=2C")
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self.first_bare = f"n={name},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
        nonce, salt, rounds = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce) or rounds < 4096:
            raise WireError("SCRAM: the broker's first message is not valid")
        salted = hashlib.pbkdf2_hmac(self.hash_name, self.password.encode(), salt, rounds)
        client_key = hmac.digest(salted, b"Client Key", self.hash_name)
        stored = hashlib.new(self.hash_name, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(stored, message, self.hash_name)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = hmac.digest(hmac.digest(salted, b"Server Key", self.hash_name), message, self.hash_name)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        fields = dict(part.split("=", 1) for part in server_final.decode().split(",") if "=" in part)
        given = base64.b64decode(fields.get("v", ""))
        if not hmac.compare_digest(given, self.server_signature):
            raise WireError("SCRAM: the broker did not prove it knows the credentials")


# ---------------------------------------------------------------------------------------------
# One connection
# ---------------------------------------------------------------------------------------------


class Connection:
    """One authenticated connection to a broker; requests are numbered, answers read in order."""

    def __init__(self, settings: Settings, host: str, port: int, deadline: float):
        self.settings, self.deadline = settings, deadline
        self.versions: dict[int, tuple[int, int]] = {}
        self._next = 0
        raw = socket.create_connection((host, port), timeout=self._left())
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock: socket.socket = raw
        try:
            if settings.tls is not None:
                self.sock = settings.tls.wrap_socket(raw, server_hostname=host)
            self.versions = self._api_versions()
            if settings.protocol.startswith("SASL"):
                self._authenticate()
        except BaseException:
            self.close()
            raise

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WireError("timed out")
        return min(left, 30.0)

    def send(self, api: int, version: int, body: bytes, flexible: bool = True) -> int:
        self._next += 1
        header = struct.pack(">hhi", api, version, self._next) + string(self.settings.client_id)
        frame = header + (b"\x00" if flexible else b"") + body
        self.sock.settimeout(self._left())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return self._next

    def receive(self, expected: int, flexible: bool = True) -> Reader:
        self.sock.settimeout(self._left())
        size = struct.unpack(">i", self._exactly(4))[0]
        reader = Reader(self._exactly(size))
        if reader.take(">i") != expected:
            raise WireError("an answer out of order")
        if flexible:
            reader.tags()
        return reader

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 16))
            if not chunk:
                raise WireError("the broker closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def call(self, api: int, version: int, body: bytes, flexible: bool = True) -> Reader:
        return self.receive(self.send(api, version, body, flexible), flexible)

    def _api_versions(self) -> dict[int, tuple[int, int]]:
        reader = self.call(API_VERSIONS, 0, b"", flexible=False)
        if reader.take(">h") != 0:
            raise WireError("ApiVersions refused")
        versions = {}
        for _ in range(reader.take(">i")):
            key, low, high = reader.take(">hhh")
            versions[key] = (low, high)
        return versions

    def version(self, api: int, low: int, high: int) -> int:
        """The highest version of `api` both ends speak, within [low, high]."""
        broker_low, broker_high = self.versions.get(api, (0, -1))
        chosen = min(high, broker_high)
        if chosen < max(low, broker_low):
            raise Unsupported(f"the broker speaks API {api} v{broker_low}-{broker_high}")
        return chosen

    def _authenticate(self) -> None:
        mechanism = self.settings.mechanism
        self.version(SASL_HANDSHAKE, 1, 1)
        reader = self.call(SASL_HANDSHAKE, 1, string(mechanism), flexible=False)
        if reader.take(">h") != 0:
            raise WireError(f"the broker does not accept SASL {mechanism}")
        version = self.version(SASL_AUTHENTICATE, 1, 1)
        if mechanism == "PLAIN":
            self._sasl(version, f"\0{self.settings.username}\0{self.settings.password}".encode())
            return
        scram = Scram(MECHANISMS[mechanism] or "", self.settings.username, self.settings.password)
        server_first = self._sasl(version, scram.first())
        scram.check(self._sasl(version, scram.final(server_first)))

    def _sasl(self, version: int, token: bytes) -> bytes:
        reader = self.call(SASL_AUTHENTICATE, version, struct.pack(">i", len(token)) + token, flexible=False)
        error = reader.take(">h")
        message = reader.string()
        answer = reader.bytes_()
        if error:
            raise WireError(f"SASL authentication failed (error {error}): {message or ''}"[:300])
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# ---------------------------------------------------------------------------------------------
# Fencing
# ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    refused: list[tuple[str, int]] = field(default_factory=list)  # (id, Kafka error code)
    requests: int = 0  # requests sent (FindCoordinator, InitProducerId), for the cost model
    connections: int = 0


def fence(config: Mapping[str, Any], txids: Iterable[str], timeout_s: float = 60.0) -> Outcome:
    """InitProducerId on every id, until each one succeeded (fenced, anything open aborted) or was
    refused by the authorizer. Unsupported: the settings or the cluster need librdkafka; WireError:
    the wire path failed (the caller falls back; fencing an id twice is harmless)."""
    settings = wire_settings(config)
    todo = list(dict.fromkeys(txids))
    if not todo:
        return Outcome()
    try:
        return _fence(settings, todo, timeout_s)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:  # an answer that is not what it asked for
        raise WireError(f"an answer it cannot read: {type(exc).__name__}: {exc}") from None


def _fence(settings: Settings, todo: list[str], timeout_s: float) -> Outcome:
    outcome = Outcome()
    deadline = time.monotonic() + timeout_s
    bootstrap = _bootstrap(settings, deadline, outcome)
    try:
        find = bootstrap.version(FIND_COORDINATOR, 4, 4)
        bootstrap.version(INIT_PRODUCER_ID, 2, 4)
        pause = 0.01
        while todo:
            by_node: dict[tuple[int, str, int], list[str]] = {}
            for chunk in range(0, len(todo), WINDOW * 4):
                batch = todo[chunk : chunk + WINDOW * 4]
                outcome.requests += 1
                found = parse_coordinators(bootstrap.call(FIND_COORDINATOR, find, find_coordinator_body(batch)))
                for txid in batch:
                    node, host, port, error = found.get(txid, (-1, "", 0, COORDINATOR_NOT_AVAILABLE))
                    if error in REFUSED:
                        outcome.refused.append((txid, error))
                    elif error:
                        by_node.setdefault((-1, "", 0), []).append(txid)  # asked again next round
                    else:
                        by_node.setdefault((node, host, port), []).append(txid)
            again = by_node.pop((-1, "", 0), [])
            stripes = [(at, ids[i::STRIPES]) for at, ids in by_node.items() for i in range(min(STRIPES, len(ids)))]
            with ThreadPoolExecutor(max_workers=max(1, min(16, len(stripes)))) as pool:
                rounds = [pool.submit(_init_all, settings, where, ids, deadline) for where, ids in stripes]
                for (_, ids), future in zip(stripes, rounds, strict=True):
                    asked_again, refused = future.result()
                    again += asked_again
                    outcome.refused += refused
                    outcome.connections += 1
                    outcome.requests += len(ids)
            todo = again
            if todo:
                if time.monotonic() + pause > deadline:
                    raise WireError(f"{len(todo)} ids not fenced within {timeout_s:.0f} s")
                time.sleep(pause)
                pause = min(0.25, pause * 2)
    finally:
        bootstrap.close()
    return outcome


def _bootstrap(settings: Settings, deadline: float, outcome: Outcome) -> Connection:
    problems = []
    for host, port in settings.brokers:
        try:
            connection = Connection(settings, host, port, deadline)
            outcome.connections += 1
            return connection
        except (OSError, WireError) as exc:
            problems.append(f"{host}:{port}: {type(exc).__name__}: {exc}"[:200])
    raise WireError(f"no broker reachable ({'; '.join(problems) or 'no bootstrap.servers'})")


def _init_all(
    settings: Settings, where: tuple[int, str, int], txids: list[str], deadline: float
) -> tuple[list[str], list[tuple[str, int]]]:
    """InitProducerId for `txids` on their coordinator, WINDOW at a time on one connection. Returns
    the ids to ask again (an abort in progress, a coordinator loading or moved) and those refused."""
    _, host, port = where
    connection = Connection(settings, host, port, deadline)
    again: list[str] = []
    refused: list[tuple[str, int]] = []
    try:
        version = connection.version(INIT_PRODUCER_ID, 2, 4)
        for start in range(0, len(txids), WINDOW):
            window = txids[start : start + WINDOW]
            numbers = [connection.send(INIT_PRODUCER_ID, version, init_producer_id_body(t, version)) for t in window]
            for txid, number in zip(window, numbers, strict=True):
                error = parse_init_producer_id(connection.receive(number))
                if error in REFUSED:
                    refused.append((txid, error))
                elif error in RETRY or error in REFIND:
                    again.append(txid)
                elif error:
                    raise WireError(f"InitProducerId for {txid}: error {error}")
    finally:
        connection.close()
    return again, refused

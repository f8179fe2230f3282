"""Schema registries for the Confluent wire format: magic byte 0, a 4-byte big-endian schema id,
then the Avro body.

Two kinds, chosen by `registry:` in a format:
- an HTTP URL: a Confluent-compatible Schema Registry (Confluent's, or Apicurio Registry's
  `/apis/ccompat/v7` API), through confluent-kafka's `SchemaRegistryClient`;
- `file:DIR`: a folder, for setups without a registry service:

      DIR/<id>.avsc        one schema per id (never changed once written)
      DIR/subjects.json    {"<subject>": [<id>, <id>, ...]}  the subject's versions, oldest first

An HTTP registry is reached with basic auth (username and password) or a bearer token, over TLS
verified against the system's CAs or a given CA file (`Connection`). Its `location`, the URL
without any credentials, is what messages, cache keys and poison decisions name.

Clients are created lazily and cached per process: Spark tasks run in Python worker processes
that are reused across tasks, so each worker asks the registry for a schema id once.
Registry trouble never decides where a record goes. An unreachable registry, a server error, a
timeout, a refused login (401, 403): the read task fails with a retriable error
(`RegistryUnavailable`) and the epoch is retried; nothing is cached. Only a definitive answer
about the id itself (HTTP 404 with the registry's "schema not found" code 40403, a missing file
in a `file:` registry, or a schema that is not Avro) makes a record poison, and only once that
answer is recorded (eos.protocol.poison; eos_connectors.formats.avro). A 404 without that code
(a wrong URL path) says nothing about the id and is retried like an outage.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eos.api import ConfigError, DependencyUnavailable

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
HEADER_SIZE = HEADER.size


SCHEMA_NOT_FOUND = 40403  # the Confluent API's error code for "no schema has this id"


class UnknownSchemaId(LookupError):
    """The registry answered: no schema has this id (or it is not an Avro schema)."""


class UnknownSubject(LookupError):
    """The registry answered: no such subject (or it has no versions)."""


class RegistryUnavailable(DependencyUnavailable):
    """The registry could not be asked (unreachable, timed out, server error)."""


@dataclass(frozen=True)
class Connection:
    """A registry as executors reach it (pickled into read tasks and UDFs). Its repr shows no
    secret, and `location` (the URL without credentials) is what every message names."""

    location: str  # an http(s) URL without userinfo, or file:/absolute/folder
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None  # absolute

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's SchemaRegistryClient settings (secrets included: never log them)."""
        # Bounded retries: a task that cannot reach the registry fails within ~10 s and Spark
        # and the epoch protocol retry it, instead of hanging the epoch.
        config: dict[str, Any] = {
            "url": self.location, "timeout": 10, "max.retries": 2, "retries.wait.ms": 500, "retries.max.wait.ms": 2000,
        }  # fmt: skip
        if self.username is not None:
            config["basic.auth.user.info"] = f"{self.username}:{self.password or ''}"
        if self.token is not None:
            # confluent-kafka sends a static token with Confluent Cloud's cluster header; a
            # registry that needs none ignores it empty.
            config.update({
                "bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": self.token,
                "bearer.auth.logical.cluster": "",
            })  # fmt: skip
        if self.ca_file is not None:
            config["ssl.ca.location"] = self.ca_file
        return config


def poison_decision(location: str, schema_id: int) -> str:
    """How a source records "this registry definitively has no (Avro) schema with this id"
    (eos.protocol.poison). Ids belong to a registry: another location is another decision."""
    return f"{location}#{schema_id}"


def poison_ids(decisions: frozenset[str], location: str) -> frozenset[int]:
    """The schema ids of `location` among a source's recorded decisions."""
    ids = set()
    for decision in decisions:
        where, _, schema_id = decision.rpartition("#")
        if where == location and schema_id.isdigit():
            ids.add(int(schema_id))
    return frozenset(ids)


class Registry(Protocol):
    location: str

    def schema_by_id(self, schema_id: int) -> dict[str, Any]: ...
    def latest(self, subject: str) -> tuple[int, dict[str, Any]]: ...
    def register(self, subject: str, schema: dict[str, Any]) -> int: ...


def wire_header(schema_id: int) -> bytes:
    return HEADER.pack(MAGIC, schema_id)


def _canonical(schema: dict[str, Any]) -> str:
    import fastavro

    return fastavro.schema.to_parsing_canonical_form(schema)


# ---------------------------------------------------------------------------------------------
# HTTP: confluent-kafka's client
# ---------------------------------------------------------------------------------------------


class HttpRegistry:
    def __init__(self, connection: Connection):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.location = connection.location
        try:
            self.client = SchemaRegistryClient(connection.client_config())
        except (ValueError, TypeError, OSError) as exc:  # a CA file that cannot be read, say
            raise ConfigError(f"schema registry {self.location}: {type(exc).__name__}: {exc}") from None

    def __repr__(self) -> str:
        return f"HttpRegistry({self.location})"

    def _call(self, what: str, call, not_found: type[Exception] | None = None):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:  # the HTTP library confluent-kafka uses (httpx2 where installed, else httpx)
            from confluent_kafka.schema_registry.common._httpx_compat import httpx
        except ImportError:
            import httpx

        try:
            return call()
        except SchemaRegistryError as exc:
            # A 404 that names what was asked for is the registry's answer about it; anything else
            # (5xx, a login refused, a 404 from a wrong path) says nothing about the record.
            if exc.http_status_code == 404 and not_found is not None and _names_the_thing(exc, not_found):
                raise not_found(f"{what}: {exc.error_message}") from None
            hint = None
            if exc.http_status_code in (401, 403):
                hint = "check the registry's username and password (or token), and what that principal may read"
            raise RegistryUnavailable(f"schema registry {self.location}: {what}: {exc}", hint) from None
        except (httpx.HTTPError, OSError) as exc:
            raise RegistryUnavailable(
                f"schema registry {self.location} unreachable ({what}): {type(exc).__name__}: {exc}"
            ) from None

    def schema_by_id(self, schema_id: int) -> dict[str, Any]:
        schema = self._call(f"schema id {schema_id}", lambda: self.client.get_schema(schema_id), UnknownSchemaId)
        if schema.schema_type not in (None, "AVRO"):
            raise UnknownSchemaId(f"schema id {schema_id} is a {schema.schema_type} schema, not Avro")
        return json.loads(schema.schema_str)

    def latest(self, subject: str) -> tuple[int, dict[str, Any]]:
        registered = self._call(f"subject {subject}", lambda: self.client.get_latest_version(subject), UnknownSubject)
        return registered.schema_id, json.loads(registered.schema.schema_str)

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        from confluent_kafka.schema_registry import Schema

        return self._call(
            f"registering under {subject}",
            lambda: self.client.register_schema(subject, Schema(json.dumps(schema), "AVRO")),
        )


def _names_the_thing(error: Any, not_found: type[Exception]) -> bool:
    """Whether a 404 is about the schema id (code 40403) or the subject (40401, 40402) asked for,
    not about the URL (a wrong path gets a 404 without those codes)."""
    if not_found is UnknownSchemaId:
        return error.error_code == SCHEMA_NOT_FOUND
    return error.error_code in (40401, 40402)


# ---------------------------------------------------------------------------------------------
# A folder
# ---------------------------------------------------------------------------------------------


class FileRegistry:
    """Schemas by id in a folder; registration (driver side, at start-up) is serialized by a lock
    file, and an id file is written once and never changed."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.location = f"file:{folder}"

    def schema_by_id(self, schema_id: int) -> dict[str, Any]:
        path = self.folder / f"{schema_id}.avsc"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            if not self.folder.is_dir():
                raise RegistryUnavailable(f"schema registry folder {self.folder} does not exist") from None
            raise UnknownSchemaId(f"schema id {schema_id}: no {path.name} in {self.folder}") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise RegistryUnavailable(f"schema registry folder {self.folder}: cannot read {path.name}: {exc}") from None

    def _subjects(self) -> dict[str, list[int]]:
        path = self.folder / "subjects.json"
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: line {exc.lineno}: {exc.msg}") from None

    def latest(self, subject: str) -> tuple[int, dict[str, Any]]:
        versions = self._subjects().get(subject)
        if not versions:
            raise UnknownSubject(f"subject {subject!r} is not in {self.folder / 'subjects.json'}")
        return versions[-1], self.schema_by_id(versions[-1])

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        canonical = _canonical(schema)
        with _locked(self.folder / ".lock"):
            subjects = self._subjects()
            ids = sorted(int(p.stem) for p in self.folder.glob("*.avsc") if p.stem.isdigit())
            schema_id = next((i for i in ids if _canonical(self.schema_by_id(i)) == canonical), None)
            if schema_id is None:
                schema_id = (ids[-1] + 1) if ids else 1
                _write_atomically(self.folder / f"{schema_id}.avsc", json.dumps(schema, indent=2))
            versions = subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
                _write_atomically(self.folder / "subjects.json", json.dumps(subjects, indent=2, sort_keys=True))
        return schema_id


@contextlib.contextmanager
def _locked(path: Path):
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


# ---------------------------------------------------------------------------------------------
# One client per location and process
# ---------------------------------------------------------------------------------------------

_clients: dict[Connection, Registry] = {}
_lock = threading.Lock()


def _absolute(path: str, base_dir: Path | None) -> Path:
    """Relative paths are relative to the pipeline file."""
    resolved = Path(path).expanduser()
    return (resolved if resolved.is_absolute() else (base_dir or Path.cwd()) / resolved).resolve()


def connection(config: Any, base_dir: Path | None = None) -> Connection:
    """A `registry:` (eos_connectors.formats.config.RegistryConfig) as executors use it: file:
    folders and the CA file made absolute."""
    url = config.url
    if url.startswith(("http://", "https://")):
        ca_file = str(_absolute(config.ca_file, base_dir)) if config.ca_file else None
        return Connection(url, config.username, config.password, config.token, ca_file)
    if not url.startswith("file:"):
        raise ConfigError(f"registry {url!r}: expected an http(s):// URL or file:DIR")
    return Connection(f"file:{_absolute(url.removeprefix('file://').removeprefix('file:'), base_dir)}")


def registry(where: Connection) -> Registry:
    """The cached client for a registry (see `connection`); a rotated password is a new client."""
    with _lock:
        client = _clients.get(where)
        if client is None:
            if where.location.startswith("file:"):
                client = FileRegistry(Path(where.location.removeprefix("file:")))
            else:
                client = HttpRegistry(where)
            _clients[where] = client
        return client

"""Schema registries for the Confluent wire format: magic byte 0, a 4-byte big-endian schema id,
then the Avro body.

Two kinds, chosen by `registry:` in a format:
- an HTTP URL: a Confluent-compatible Schema Registry (Confluent's, or Apicurio Registry's
  `/apis/ccompat/v7` API), through confluent-kafka's `SchemaRegistryClient`;
- `file:DIR`: a folder, for setups without a registry service:

      DIR/<id>.avsc        one schema per id (never changed once written)
      DIR/subjects.json    {"<subject>": [<id>, <id>, ...]}  the subject's versions, oldest first

Clients are created lazily and cached per process: Spark tasks run in Python worker processes
that are reused across tasks, so each worker asks the registry for a schema id once.
Registry trouble never decides where a record goes: an unreachable registry, and an id the
registry does not know (a lagging replica, a schema registered a moment later), fail the read
task with a retriable error (`DependencyUnavailable`) and the epoch is retried; neither answer is
cached. Otherwise one attempt could send a record to the dead-letter queue and a replay could send
it to the output, so that it ends up in both or in neither.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import threading
from pathlib import Path
from typing import Any, Protocol

from eos.api import ConfigError, DependencyUnavailable

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
HEADER_SIZE = HEADER.size


class UnknownSchemaId(LookupError):
    """The registry answered: no schema has this id."""


class UnknownSubject(LookupError):
    """The registry answered: no such subject (or it has no versions)."""


class RegistryUnavailable(DependencyUnavailable):
    """The registry could not be asked (unreachable, timed out, server error)."""


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
    def __init__(self, url: str):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.location = url
        # Bounded retries: a task that cannot reach the registry fails within ~10 s and Spark
        # and the epoch protocol retry it, instead of hanging the epoch.
        self.client = SchemaRegistryClient(
            {"url": url, "timeout": 10, "max.retries": 2, "retries.wait.ms": 500, "retries.max.wait.ms": 2000}
        )

    def _call(self, what: str, call, not_found: type[Exception] | None = None):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:  # the HTTP library confluent-kafka uses (httpx2 where installed, else httpx)
            from confluent_kafka.schema_registry.common._httpx_compat import httpx
        except ImportError:
            import httpx

        try:
            return call()
        except SchemaRegistryError as exc:
            # 404 is the registry's answer about the thing asked for; anything else (5xx, auth)
            # says nothing about the record.
            if exc.http_status_code == 404 and not_found is not None:
                raise not_found(f"{what}: {exc.error_message}") from None
            raise RegistryUnavailable(f"schema registry {self.location}: {what}: {exc}") from None
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
            raise UnknownSchemaId(f"no {path.name} in {self.folder}") from None
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

_clients: dict[str, Registry] = {}
_lock = threading.Lock()


def resolve_location(location: str, base_dir: Path | None = None) -> str:
    """A location executors can use as is: URLs unchanged, file: folders made absolute (relative
    ones are relative to the pipeline file)."""
    if location.startswith(("http://", "https://")):
        return location
    if not location.startswith("file:"):
        raise ConfigError(f"registry {location!r}: expected an http(s):// URL or file:DIR")
    folder = Path(location.removeprefix("file://").removeprefix("file:")).expanduser()
    if not folder.is_absolute():
        folder = (base_dir or Path.cwd()) / folder
    return f"file:{folder.resolve()}"


def registry(location: str) -> Registry:
    """The cached client for a resolved location (see `resolve_location`)."""
    with _lock:
        client = _clients.get(location)
        if client is None:
            if location.startswith("file:"):
                client = FileRegistry(Path(location.removeprefix("file:")))
            else:
                client = HttpRegistry(location)
            _clients[location] = client
        return client

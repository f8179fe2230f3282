"""How `eos verify` compares expected with committed output: pure logic, no servers.

Values from different readers (Spark's JSON of the expected rows, the output's JSON or Avro,
PostgreSQL's rows) are first put in one canonical form (`canonical`), then compared:

- numbers as numbers, floats within a tolerance (relative and absolute, as `math.isclose`);
- timestamps as instants to the millisecond (JSON and Avro millis carry no more), whatever their
  time zone or type; a missing field equals null (Spark's JSON leaves null fields out);
- rows as multisets (`multiset_diff`: every expected row exactly once) or as a changelog
  (`last_per_identity`: the last value per key is what counts).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}(:?\d{2})?)?$")


@dataclass(frozen=True)
class Tolerance:
    """Floats are equal when math.isclose(a, b, rel_tol=rel, abs_tol=abs)."""

    rel: float = 1e-9
    abs: float = 1e-9


@dataclass(frozen=True, order=True)
class Instant:
    """A timestamp, in milliseconds since the epoch (a naive one read as UTC wall-clock time)."""

    millis: int

    def __str__(self) -> str:
        stamp = datetime.fromtimestamp(self.millis / 1000, tz=timezone.utc)
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _instant(value: datetime) -> Instant:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return Instant((delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000)


def canonical(value: Any) -> Any:
    """One form for a value from any reader: None, bool, int, float, str, Instant, dict, list."""
    if value is None or isinstance(value, (bool, int, float, Instant)):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return _instant(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, str):
        if _TIMESTAMP.match(value):
            try:
                return _instant(datetime.fromisoformat(value.replace(" ", "T", 1)))
            except ValueError:
                return value
        return value
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return str(value)


def equal(a: Any, b: Any, tol: Tolerance) -> bool:
    """Canonical values equal, floats within the tolerance."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=tol.rel, abs_tol=tol.abs)
    if isinstance(a, dict) and isinstance(b, dict):
        return all(equal(a.get(k), b.get(k), tol) for k in a.keys() | b.keys())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y, tol) for x, y in zip(a, b, strict=True))
    return a == b


def _freeze(value: Any, floats: list[float]) -> Hashable:
    """A hashable shape of a canonical value with its floats taken out (into `floats`), so rows
    that differ only within the tolerance land in the same bucket."""
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        floats.append(float(value))
        return "#"
    if isinstance(value, dict):
        return tuple((k, _freeze(value[k], floats)) for k in sorted(value))
    if isinstance(value, list):
        return ("[", *(_freeze(v, floats) for v in value))
    return value


def multiset_diff(expected: Sequence[Any], seen: Sequence[Any], tol: Tolerance) -> tuple[list[Any], list[Any]]:
    """(lost, extra): expected rows not seen, and seen rows beyond the expected ones (unexpected
    rows and duplicates), each row matched at most once, floats within the tolerance."""
    buckets: dict[Hashable, tuple[list[tuple[list[float], Any]], list[tuple[list[float], Any]]]] = {}
    for side, rows in ((0, expected), (1, seen)):
        for row in rows:
            floats: list[float] = []
            shape = _freeze(row, floats)
            buckets.setdefault(shape, ([], []))[side].append((floats, row))
    lost: list[Any] = []
    extra: list[Any] = []
    for want, got in buckets.values():
        if len(want) == 1 and len(got) == 1 and want[0][0] == got[0][0]:
            continue  # the common case: one row each, equal
        got = sorted(got, key=lambda item: item[0])
        used = [False] * len(got)
        for floats, row in sorted(want, key=lambda item: item[0]):
            match = next(
                (i for i, (other, _) in enumerate(got) if not used[i] and _floats_close(floats, other, tol)), None
            )
            if match is None:
                lost.append(row)
            else:
                used[match] = True
        extra.extend(row for (_, row), taken in zip(got, used, strict=True) if not taken)
    return lost, extra


def _floats_close(a: list[float], b: list[float], tol: Tolerance) -> bool:
    return all(
        (x == y) or (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=tol.rel, abs_tol=tol.abs)
        for x, y in zip(a, b, strict=True)
    )


def freeze(value: Any) -> Hashable:
    """A hashable form of a canonical value (an identity: a key, or key columns)."""
    if isinstance(value, dict):
        return tuple((k, freeze(value[k])) for k in sorted(value))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Position:
    """Where a changelog record is: its order is the order of its updates (one partition)."""

    partition: int
    offset: int
    timestamp_ms: int


def last_per_identity(records: Iterable[tuple[Hashable, Any, Position]]) -> dict[Hashable, Any]:
    """The last value per identity: by offset within its partition (a keyed record's updates
    share one partition), by timestamp then offset if its records are spread over partitions."""
    found: dict[Hashable, list[tuple[Position, Any]]] = {}
    for identity, row, position in records:
        found.setdefault(identity, []).append((position, row))
    last = {}
    for identity, items in found.items():
        if len({position.partition for position, _ in items}) == 1:
            last[identity] = max(items, key=lambda item: item[0].offset)[1]
        else:
            last[identity] = max(items, key=lambda item: (item[0].timestamp_ms, item[0].offset))[1]
    return last


def repeated_in_one_transaction(records: Sequence[tuple[Hashable, Position]]) -> list[tuple[Hashable, int, int]]:
    """Identities written twice with no transaction boundary between the two (partition, offsets).

    Every commit or abort marker takes an offset a read_committed reader never receives, so two
    records of one partition with no gap in their offsets between them were written before any
    transaction ended there. An epoch writes a key of an update-mode aggregate once, and eos
    commits an epoch before it writes the next: such a pair is a duplicate."""
    by_partition: dict[int, list[tuple[int, Hashable]]] = {}
    for identity, position in records:
        by_partition.setdefault(position.partition, []).append((position.offset, identity))
    repeats = []
    for partition, items in by_partition.items():
        items.sort(key=lambda item: item[0])
        run: dict[Hashable, int] = {}  # identity -> offset, since the last gap
        previous = None
        for offset, identity in items:
            if previous is not None and offset != previous + 1:
                run = {}
            if identity in run:
                repeats.append((identity, partition, offset))
            run[identity] = offset
            previous = offset
    return repeats


def show(value: Any, limit: int = 200) -> str:
    """An example for a report: canonical values as their plain text, cut to `limit`."""
    text = repr(_plain(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    if isinstance(value, Instant):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value

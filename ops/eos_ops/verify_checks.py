"""One output of a pipeline checked against its expected rows, and the report of them all.

A sink's expected rows come from the pipeline's transforms run as a batch query
(eos_ops.verify_pipeline); here they meet the committed output under the sink's semantics:

- `rows`: every expected row exactly once (append mode, an append table, a dead-letter queue);
- `changelog`: the last value per identity is the expected one (an update-mode aggregate, an
  upsert table): earlier values of a key are updates, not duplicates;
- `final rows`: a changelog whose rows have no identity the verifier can tell (no key, and no
  non-numeric columns that tell the rows apart): every expected final row must be present.

Rows that differ only because the watermark dropped late records in streaming (where the batch
query counts them) are reported apart, as are windows the watermark has not closed yet: neither
is a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eos_ops.verify_compare import (
    Position,
    Tolerance,
    equal,
    freeze,
    last_per_identity,
    multiset_diff,
    repeated_in_one_transaction,
    show,
)

Identity = Callable[[Any], Hashable]


def _drop_numbers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_numbers(v) for k, v in value.items() if not _is_number(v)}
    if isinstance(value, list):
        return [_drop_numbers(v) for v in value if not _is_number(v)]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def identity_of(key: Callable[[Any], Any]) -> Identity:
    """A row's identity from its declared key."""
    return lambda row: freeze(key(row))


def identity_with_fields(key: Callable[[Any], Any]) -> Identity:
    """The declared key plus the row's non-numeric fields: tells apart the rows of an aggregate
    keyed coarser than its groups (key: country, rows per country and window)."""
    return lambda row: freeze([key(row), _drop_numbers(row)])


def choose_identity(rows: Sequence[Any], candidates: Sequence[tuple[str, Identity]]) -> tuple[str, Identity] | None:
    """The first candidate identity that tells every expected row apart."""
    for name, candidate in candidates:
        seen = [candidate(row) for row in rows]
        if len(set(seen)) == len(seen):
            return name, candidate
    return None


@dataclass
class Check:
    """One output checked: a sink, or a source's dead-letter queue."""

    name: str
    target: str  # "Kafka topic X", "PostgreSQL table Y"
    semantics: str  # said in the report
    expected: int = 0
    output_records: int = 0
    read_uncommitted: int | None = None  # a topic: what a read_uncommitted reader sees
    prepared: int | None = None  # a table: prepared transactions waiting in its database
    lost: list[Any] = field(default_factory=list)
    duplicated: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)
    wrong: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (identity, seen, expected)
    undecodable: list[str] = field(default_factory=list)
    open: list[Any] = field(default_factory=list)  # windows the watermark has not closed: not expected yet
    late: list[Any] = field(default_factory=list)  # differences explained by records dropped as late
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.wrong or self.undecodable)

    @property
    def problems(self) -> dict[str, list[Any]]:
        return {"lost": self.lost, "duplicated": self.duplicated, "unexpected": self.unexpected,
                "wrong": self.wrong, "undecodable": self.undecodable}  # fmt: skip

    def summary(self) -> str:
        found = [f"{len(items)} {label}" for label, items in self.problems.items() if items]
        return ", ".join(found)

    def lines(self) -> Iterable[str]:
        yield f"{self.name} -> {self.target} ({self.semantics})"
        if self.prepared is not None:
            waiting = ": their rows are invisible until they are resolved" if self.prepared else ""
            seen = f"{self.output_records} committed rows ({self.prepared} prepared transactions waiting{waiting})"
        else:
            aborted = (self.read_uncommitted or 0) - self.output_records
            why = "faults happened and were rolled back" if aborted else "no aborted transactions"
            seen = (
                f"{self.output_records} committed records, {self.read_uncommitted} seen by read_uncommitted "
                f"({aborted} aborted: {why})"
            )
        yield f"  expected {self.expected}; output: {seen}"
        counts = ", ".join(f"{label} {len(items)}" for label, items in self.problems.items() if label != "undecodable")
        yield f"  {counts}" + (f", undecodable {len(self.undecodable)}" if self.undecodable else "")
        labels = {"wrong": "wrong (key, seen, expected)"}
        for label, items in self.problems.items():
            if items:
                yield f"  {labels.get(label, label)}, e.g.: {_examples(items)}"
        if self.open:
            yield f"  still open (no watermark has closed them: not expected yet): {len(self.open)}, e.g.: " + str(
                _examples(self.open)
            )
        if self.late:
            yield f"  explained by records the watermark dropped as late: {len(self.late)}, e.g.: " + str(
                _examples(self.late)
            )
        for note in self.notes:
            yield f"  note: {note}"
        yield f"  {'EXACTLY ONCE' if self.ok else 'FAILED: ' + self.summary()}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "target": self.target, "semantics": self.semantics, "ok": self.ok,
            "expected": self.expected, "output_records": self.output_records,
            **{label: len(items) for label, items in self.problems.items()},
            "open": len(self.open), "late": len(self.late), "notes": self.notes,
            "examples": {label: _examples(items) for label, items in
                         {**self.problems, "open": self.open, "late": self.late}.items() if items},
        }  # fmt: skip
        if self.prepared is not None:
            data["prepared_transactions"] = self.prepared
        else:
            data["read_uncommitted_records"] = self.read_uncommitted
            data["aborted_records_seen"] = (self.read_uncommitted or 0) - self.output_records
        return data


def _examples(items: Sequence[Any]) -> list[str]:
    return [show(item) for item in items[:5]]


# ---------------------------------------------------------------------------------------------
# The comparisons
# ---------------------------------------------------------------------------------------------


def check_rows(
    check: Check,
    expected: Sequence[Any],
    seen: Sequence[Any],
    tol: Tolerance,
    pair: Identity | None = None,
    without_late: Sequence[Any] | None = None,
) -> None:
    """Every expected row exactly once. `pair` (an identity) turns a lost and an unexpected row
    of one identity into one wrong row; `without_late` are the expected rows had the records
    that may have been late been dropped: differences they explain are reported as late."""
    check.expected = len(expected)
    lost, extra = multiset_diff(expected, seen, tol)
    _, unexpected = multiset_diff(expected, extra, tol)  # extra rows equal to no expected row
    duplicated, _ = multiset_diff(extra, unexpected, tol)
    if without_late is not None and (lost or unexpected):
        lost, unexpected = _explain_late(check, expected, without_late, lost, unexpected, tol, pair)
    if pair is not None:
        by_identity = {pair(row): row for row in unexpected}
        still_lost = []
        for row in lost:
            other = by_identity.pop(pair(row), None)
            if other is None:
                still_lost.append(row)
            else:
                check.wrong.append((pair(row), other, row))
        lost, unexpected = still_lost, [row for row in unexpected if pair(row) in by_identity]
    check.lost, check.duplicated, check.unexpected = lost, duplicated, unexpected


def _explain_late(
    check: Check,
    expected: Sequence[Any],
    without_late: Sequence[Any],
    lost: list[Any],
    unexpected: list[Any],
    tol: Tolerance,
    pair: Identity | None,
) -> tuple[list[Any], list[Any]]:
    """A lost row whose value depends on possibly-late records is explained when the output
    holds its value without them instead (same identity), or when no value remains without them
    (every record of its group was late); that other value is explained with it."""
    only_with, only_without = multiset_diff(expected, without_late, tol)
    identity = pair or identity_with_fields(lambda row: None)
    remaining = {identity(row) for row in without_late}
    alternatives = {identity(row) for row in unexpected if _contains(only_without, row, tol)}
    kept_lost, kept_unexpected = [], []
    explained: set[Hashable] = set()
    for row in lost:
        key = identity(row)
        if _contains(only_with, row, tol) and (key in alternatives or key not in remaining):
            check.late.append(row)
            explained.add(key)
        else:
            kept_lost.append(row)
    for row in unexpected:
        if identity(row) in explained and _contains(only_without, row, tol):
            check.late.append(row)
        else:
            kept_unexpected.append(row)
    return kept_lost, kept_unexpected


def _contains(rows: Sequence[Any], row: Any, tol: Tolerance) -> bool:
    return any(equal(row, other, tol) for other in rows)


def check_changelog(
    check: Check,
    expected: Sequence[Any],
    seen: Sequence[tuple[Any, Position | None]],
    identity: Identity,
    tol: Tolerance,
    without_late: Sequence[Any] | None = None,
) -> None:
    """The last value per identity. Records of a topic carry positions: the last one counts, and
    one identity twice within one transaction is a duplicate. Rows of a table have none: one row
    per identity."""
    wanted: dict[Hashable, list[Any]] = {}
    for row in expected:
        wanted.setdefault(identity(row), []).append(row)
    alternative = {identity(row): row for row in without_late or ()}
    check.expected = len(wanted)
    positioned = [(identity(row), row, position) for row, position in seen if position is not None]
    last = last_per_identity(positioned)
    if len(positioned) < len(seen):  # table rows
        counts: dict[Hashable, int] = {}
        for row, _ in seen:
            key = identity(row)
            counts[key] = counts.get(key, 0) + 1
            last[key] = row
        check.duplicated = [key for key, n in counts.items() if n > 1]
    else:
        check.duplicated = [
            f"{key} twice in one transaction (partition {partition}, offset {offset})"
            for key, partition, offset in repeated_in_one_transaction([(k, p) for k, _, p in positioned])
        ]
    for key, candidates in wanted.items():
        value = last.get(key)
        if value is None:
            if without_late is not None and key not in alternative:
                check.late.append(candidates[-1])
            else:
                check.lost.append(candidates[-1])
        elif not any(equal(value, candidate, tol) for candidate in candidates):
            if key in alternative and equal(value, alternative[key], tol):
                check.late.append((key, value, candidates[-1]))
            else:
                check.wrong.append((key, value, candidates[-1]))
    several = [key for key, candidates in wanted.items() if len(candidates) > 1]
    if several:
        check.notes.append(
            f"{len(several)} keys get several values from the input (e.g. {show(several[0])}): the last one written "
            "wins, in an order verify cannot know, so any of them is accepted"
        )
    check.unexpected = [last[key] for key in last if key not in wanted]


def check_final_rows(check: Check, expected: Sequence[Any], seen: Sequence[Any], tol: Tolerance) -> None:
    """Every expected final row present; other rows may be earlier updates of the same groups."""
    check.expected = len(expected)
    check.lost, extra = multiset_diff(expected, seen, tol)
    if extra:
        check.notes.append(f"{len(extra)} other rows: earlier updates (not checked: no key tells the rows apart)")

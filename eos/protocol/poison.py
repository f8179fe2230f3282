"""Poison decisions: a record that only an outside answer can call poison is routed the same way
in every replay.

Poison is a property of the record (docs/EXACTLY_ONCE.md): most undecodable records say so by
their bytes alone. Some cannot: a Schema Registry record names its schema by id, and only the
registry can say that the id does not exist. Such an answer is acted on only once it is
recorded:

1. a read task that meets one fails its attempt with `PoisonDecision` (eos.errors), naming the
   source and its decisions: strings of the source's own (the core stores them, never reads them);
2. the driver adds them to the checkpoint's metadata (`CheckpointMeta.poison`), durably, before
   the next attempt starts; nothing of the failed attempt was committed (its job failed);
3. every job of every epoch from then on, replays after a crash included, carries the recorded
   decisions to its tasks (a Spark local property, set on the driver's thread that submits the
   epoch's job), and the source routes those records as poison by the recorded decision alone,
   without asking again.

So a record's route never depends on when its epoch ran: before the decision it is not routed
at all, after it every attempt routes it the same way. Decisions only grow (until `eos reset`).
"""

from __future__ import annotations

import json

PROPERTY = "eos.poison.decisions"  # the job's local property (JSON: source -> decisions)


def job_property(decisions: dict[str, list[str]]) -> str | None:
    """The property's value for an epoch's job (None: nothing recorded, the property unset)."""
    return json.dumps(decisions, sort_keys=True) if any(decisions.values()) else None


def recorded(source: str) -> frozenset[str]:
    """In a Spark task: the decisions recorded for `source` when the task's job was submitted."""
    from pyspark import TaskContext

    context = TaskContext.get()
    text = context.getLocalProperty(PROPERTY) if context is not None else None
    return frozenset(json.loads(text).get(source, ())) if text else frozenset()


def add(decisions: dict[str, list[str]], source: str, new: list[str]) -> list[str]:
    """Add `new` to `source`'s recorded decisions (in place); the ones not recorded before."""
    known = set(decisions.get(source, ()))
    added = sorted(set(new) - known)
    if added:
        decisions[source] = sorted(known | set(added))
    return added

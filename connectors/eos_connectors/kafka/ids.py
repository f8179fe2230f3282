"""Transactional ids: the one place they are built.

`<prefix>/<sink>/<n>`: the n-th id of a sink's pool (leased to Python workers by the vote
service), and `eos/<pipeline>/~driver`: the driver's own id (the control log). `prefix` is
`eos/<pipeline>` unless the sink sets `transactional_id_prefix` (for ACLs by prefix). Pipeline,
sink and prefix names never contain `/`, and sink names never start with `~`, so two different
(pipeline, sink, n) can never build the same id; dead-letter sinks are named `<source>.dlq`, a
name no configured sink can have (sink names have no `.`).
"""

from __future__ import annotations

SEPARATOR = "/"


def default_prefix(pipeline: str) -> str:
    return f"eos{SEPARATOR}{pipeline}"


def pool_id(prefix: str, sink: str, number: int) -> str:
    for part in (sink,):
        if SEPARATOR in part:
            raise ValueError(f"{part!r} cannot be part of a transactional id (it contains {SEPARATOR!r})")
    return f"{prefix}{SEPARATOR}{sink}{SEPARATOR}{number}"


def driver_id(pipeline: str) -> str:
    return f"{default_prefix(pipeline)}{SEPARATOR}~driver"

"""Fencing and recovery: what the driver does before the first epoch, and between a failed
attempt and the next one.

In this order, for every sink of the pipeline:
  1. fence: sinks whose pre-committed transactions die with their producer (Kafka) abort whatever
     the pipeline left open and make every earlier producer unable to commit (`init_transactions`
     on every transactional id the pipeline ever handed out);
  2. resolve: sinks whose prepared transactions survive (PostgreSQL) commit exactly the prepared
     transactions of the last recorded commit decision and roll back every other one;
  3. read the ledgers, only now: nothing of this pipeline can still commit behind the reader's
     back, in any system (fencing one cluster and then reading its ledger while another
     cluster still has open transactions could miss a commit that lands a moment later);
  4. check the ledgers against the checkpoint (eos.protocol.ledger.check_against_checkpoint).
Spark then replays the pending epoch with its logged offsets, and the slots whose ledger entry
shows the epoch write nothing.

Sinks are grouped by kind and by the identity of their system (`SinkConnector.system()`: a
Kafka cluster id, a database): this is the one place that groups them.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from eos.protocol.checkpoint import Checkpoint
from eos.protocol.decision import Decision, Pool
from eos.protocol.ledger import Ledger, check_against_checkpoint
from eos.protocol.report import RecoveryReport
from eos.protocol.sink import Recovery, SinkConnector

log = logging.getLogger("eos.recovery")


def by_system(sinks: list[SinkConnector]) -> dict[tuple[type[SinkConnector], str], list[SinkConnector]]:
    """Sinks grouped by kind and system; the key's class is the group's first sink's (a
    specialised sink, such as a dead-letter queue, groups with the other sinks of its kind)."""
    groups: dict[tuple[str, str], list[SinkConnector]] = defaultdict(list)
    for sink in sinks:
        groups[(type(sink).kind, sink.system())].append(sink)
    return {(type(group[0]), system): group for (_, system), group in groups.items()}


def recover(
    sinks: list[SinkConnector],
    pools: dict[str, Pool],
    decision: Decision | None,
    checkpoint: Checkpoint,
    checkpoint_id: str,
    timeout_s: float,
    reason: str,
    read_ledgers: bool = True,
) -> RecoveryReport:
    """Fence and resolve every sink's transactions, then (unless `read_ledgers` is off: `eos
    reset`, which is about to forget them) read the ledgers and check them against the checkpoint."""
    started = time.monotonic()
    groups = by_system(sinks)
    fenced = 0
    for (kind, system), group in groups.items():
        if kind.recovery is Recovery.REPLAY:
            here = {name: pool for name, pool in pools.items() if pool.kind == kind.kind and pool.system == system}
            fenced += kind.fence(group, here, timeout_s)
    reachable = {(kind.kind, system) for kind, system in groups}
    for name, pool in pools.items():
        if (pool.kind, pool.system) not in reachable:  # a removed sink on a system no sink uses now
            log.warning(
                "sink %s (no longer configured) left %d transactional ids on %s, which no configured sink reaches: "
                "they cannot be fenced from here (their open transactions end at their timeout)",
                name, pool.size, pool.system,
            )  # fmt: skip
    resolved: dict[str, int] = {}
    for (kind, _), group in groups.items():
        if kind.recovery is Recovery.RESUME:
            for what, n in kind.resolve(group, decision).items():
                resolved[what] = resolved.get(what, 0) + n
    ledger: Ledger = {}
    for (kind, system), group in groups.items():
        if not read_ledgers:
            break
        found = kind.read_ledger(group)
        check_against_checkpoint(found, checkpoint_id, checkpoint.last_logged_epoch(), f"the ledger of {system}")
        ledger.update(found)
    return RecoveryReport(fenced, resolved, time.monotonic() - started, ledger, reason)

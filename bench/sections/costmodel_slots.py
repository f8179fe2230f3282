"""Synthetic slots for the cost model (bench.sections.costmodel): processes of their own that speak
the real vote protocol (eos.protocol.channel.VoteClient) to a driver's vote service, as a Kafka
sink's slot does: lease an id (offering the one it held last epoch), vote `prepared`, wait for the
decision, report `committed`. They write nothing to Kafka: what is measured is the driver's side.

Run as `python -m bench.sections.costmodel_slots`, one line of JSON per epoch on stdin:
{"host", "port", "key", "epoch", "attempt", "jobs": [[slot, sink], ...]}; it answers one line per
epoch when every job of it has reported its commit: {"ok": n, "failed": [...]}.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from eos.protocol.channel import COMMIT, KEPT, CoordinatorAddress, VoteClient

_held: dict[tuple[int, str], int] = {}  # (slot, sink) -> the id it held last epoch (its worker's idle id)


def one_job(address: CoordinatorAddress, epoch: int, attempt: int, slot: int, sink: str) -> str:
    """One slot's exchange for one sink; "" if it committed, else what went wrong."""
    client = VoteClient(address, epoch, attempt, 60.0)  # on a kept connection after the first epoch
    try:
        held = _held.get((slot, sink))
        idle = [] if held is None else [held]
        lease = client.request("lease", sink=sink, slot=slot, worker=f"bench-{slot}", idle=idle)
        if "number" not in lease:
            return f"lease: {lease}"
        number = int(lease["number"])
        _held[(slot, sink)] = number
        fields: dict[str, Any] = {"sink": sink, "handle": f"eos/bench/{sink}/{number}", "slot": slot,
                                  "task_attempt": 0, "lease": number, "records": 100}  # fmt: skip
        reply = client.request("prepared", **fields)
        if reply.get("decision") != COMMIT:
            return f"decision: {reply}"
        done = client.request("committed", **fields)
        return "" if done.get("ok") else f"committed: {done}"
    finally:
        client.close()


def run_epoch(order: dict[str, Any]) -> dict[str, Any]:
    address = CoordinatorAddress(order["host"], int(order["port"]), order["key"])
    failed: list[str] = []
    threads = []
    for slot, sink in order["jobs"]:

        def job(slot: int = slot, sink: str = sink) -> None:
            problem = one_job(address, order["epoch"], order["attempt"], slot, sink)
            if problem:
                failed.append(f"{sink} {slot}: {problem}"[:300])

        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(120)
    return {"ok": len(order["jobs"]) - len(failed), "failed": failed[:5]}


def main() -> None:
    # One process here stands for many Python workers (one per slot it runs), each of which keeps
    # its own idle connections: together they keep one per (slot, sink).
    KEPT.KEEP = 1 << 20
    for line in sys.stdin:
        print(json.dumps(run_epoch(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()

"""The report's Targets table: one row per target of the issue, each with its baseline from the
same run, its ratio and a verdict. Each section's module says what its targets are."""

from __future__ import annotations

from typing import Any

from bench.report import faults, latency, peers, throughput
from bench.report.tables import table
from bench.sections import failover

# In the order of the table
TARGETS = (
    throughput.throughput_targets,
    peers.peer_targets,
    latency.latency_targets,
    latency.trigger_throughput_targets,
    latency.epochcost_targets,
    latency.skew_targets,
    peers.postgres_targets,
    throughput.cluster_targets,
    faults.recovery_targets,
    failover.targets,
    faults.memory_targets,
    faults.failpoint_targets,
)


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    return [row for rows in TARGETS for row in rows(results)]


def summary(results: dict[str, Any]) -> list[str]:
    out = [
        "## Targets",
        "",
        "Each ratio is paired: taken within one round (every configuration runs once per round, in an order that",
        "changes from round to round), median over rounds. Verdicts use the wall-clock figures.",
        throughput.throughput_orders(results.get("throughput")),
        "",
    ]
    rows = [[r["name"], r["measured"], r["baseline"], r["value"], r["target"], f"**{r['verdict']}**"]
            for r in targets(results)]  # fmt: skip
    return out + table(["target", "measured", "baseline (same run)", "ratio / value", "target", "verdict"], rows)

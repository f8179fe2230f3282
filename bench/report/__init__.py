"""docs/BENCHMARKS.md from the results JSON: every figure with its baseline and ratio.

Rendering is separate from measuring (`python -m bench --render FILE`), so the text can be fixed
without re-running an hour of benchmarks. The hand-written analysis of missed targets lives in
bench/NOTES.md and is included at the end.

- tables: numbers, spreads, markdown tables, a section's heading, the CPU table;
- header: what was run where (heading, machine, caveats), merged runs, the run log;
- summary: the Targets table, from each section module's targets;
- throughput, latency, epochs, faults, peers, profiles: each section's text and targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import epochs, faults, header, latency, peers, profiles, summary, throughput
from bench.sections import delta, failover, jvmreader

NOTES = Path(__file__).resolve().parent.parent / "NOTES.md"
# The sections' texts, in the report's order
PARTS = (
    throughput.throughput,
    latency.latency,
    epochs.protocol,
    faults.recovery,
    throughput.scaling,
    faults.memory,
    faults.failpoints,
    peers.peers,
    latency.epochcost,
    latency.skew,
    throughput.cluster,
    peers.postgres,
    epochs.costmodel,
    delta.report,
    failover.report,
    jvmreader.report,
    profiles.profiles,
)


def render(results: dict[str, Any]) -> str:
    lines = header.header(results) + summary.summary(results)
    for part in PARTS:
        lines += part(results)
    lines += header.run_log(results)
    if NOTES.exists():
        lines += ["", NOTES.read_text().rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"

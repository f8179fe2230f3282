"""3. Protocol cost per epoch: each phase's share of the epoch, and the decision + commit in ms.

Derived from the epochs the other sections ran (no runs of its own): the exactly-once
throughput epochs of the stateless pipeline (large epochs) and the exactly-once latency epochs at
a 1 s trigger (small epochs), with the at-least-once epochs of the same runs beside them.
Phases of an epoch (Spark's triggerExecution, the baseline every share is relative to):
  plan        latestOffset + getBatch + queryPlanning + walCommit (the offset log: the barrier)
  job         the Spark job (one stage: read + decode in the source's task, transforms, and the
              sink writer's encode + produce in the same task) until the slowest slot starts its
              pre-commit
  pre-commit  the slowest slot's pre-commit: ledger record + flush
  decide      recording the commit decision in the control log (exactly-once)
  commit      releasing the slots' commits and waiting until every one is reported
  driver      foreachBatch around the protocol (planning the attempt, folding reports, listeners)
  mark        Spark's commit log (commitOffsets)
  other       the rest of Spark's trigger (progress reporting, scheduling)
"""

from __future__ import annotations

from typing import Any

from bench.runs import ALO, EO
from bench.stats import percentile, summarize

PHASES = ("plan", "job", "precommit", "decide", "commit", "driver", "mark", "other")


def phases(epoch: dict[str, Any]) -> dict[str, float]:
    trigger = epoch["trigger_s"]
    job = epoch.get("job_s", epoch["add_batch_s"])
    precommit = min(epoch.get("precommit_s", 0.0), job)
    parts = {
        "plan": epoch["plan_s"],
        "job": job - precommit,
        "precommit": precommit,
        "decide": epoch.get("decide_s", 0.0),
        "commit": epoch.get("commit_s", 0.0),
        "driver": epoch.get("driver_s", 0.0),
        "mark": epoch["mark_s"],
    }
    parts["other"] = max(0.0, trigger - epoch["plan_s"] - epoch["add_batch_s"] - epoch["mark_s"])
    return parts


def breakdown(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Shares (sum of phase / sum of epoch time) and median ms per epoch, over epochs with data."""
    real = [e for e in epochs if e.get("records_out", e.get("input_rows")) and e["trigger_s"] > 0]
    if not real:
        return {"epochs": 0}
    split = [phases(e) for e in real]
    total = sum(e["trigger_s"] for e in real)
    return {
        "epochs": len(real),
        "epoch_s": summarize([e["trigger_s"] for e in real]).to_dict(),
        "records_per_epoch": summarize([e.get("records_out") or e.get("input_rows") or 0 for e in real]).to_dict(),
        "share_pct": {p: round(100 * sum(s[p] for s in split) / total, 1) for p in PHASES},
        "median_ms": {p: round(1000 * summarize([s[p] for s in split]).median, 1) for p in PHASES},
        "init_ms": round(1000 * summarize([e.get("init_s", 0.0) for e in real]).median, 1),
        "init_max_ms": round(1000 * max(e.get("init_s", 0.0) for e in real), 1),
        "init_share_pct": round(100 * sum(e.get("init_s", 0.0) for e in real) / total, 1),
        "producers_created": sum(e.get("producers_created", 0) for e in real),
        "producers_reused": sum(e.get("producers_reused", 0) for e in real),
    }


def run(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"sets": {}}
    throughput = results.get("throughput", {}).get("pipelines", {}).get("stateless", {}).get("runs", {})
    for mode in (EO, ALO):
        epochs = [e for row in throughput.get(mode, []) for e in row["epochs"]]
        if epochs:
            size = results["throughput"]["epoch_records"]
            out["sets"][f"{mode}, available-now, {size:,}-record epochs"] = breakdown(epochs)
    for row_mode in (EO, ALO):
        epochs = [
            e
            for row in results.get("latency", {}).get("runs", [])
            if row["mode"] == row_mode and row["trigger"] == "1s"
            for e in row["epochs"]
        ]
        if epochs:
            out["sets"][f"{row_mode}, 1 s trigger (latency runs)"] = breakdown(epochs)
    rounds = [
        (e.get("decide_s", 0.0) + e.get("commit_s", 0.0)) * 1000
        for section in (
            throughput.get(EO, []),
            [r for r in results.get("latency", {}).get("runs", []) if r["mode"] == EO],
        )
        for row in section
        for e in row["epochs"]
        if e.get("decide_s")
    ]
    if rounds:
        out["agreement_ms"] = {
            "epochs": len(rounds),
            "p50": round(percentile(rounds, 50), 2),
            "p99": round(percentile(rounds, 99), 2),
            "max": round(max(rounds), 2),
        }
    return out

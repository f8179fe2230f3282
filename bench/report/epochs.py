"""Section 3: where an epoch's time goes (the protocol's phases), what a fresh sink producer costs,
and what transactions cost the broker."""

from __future__ import annotations

from typing import Any

from bench.report.tables import n, opening, span, table, titled
from bench.runs import ALO, EO
from bench.sections.protocol import PHASES
from bench.stats import by_round, summarize

PHASE_NAMES = {
    "plan": "plan (offsets logged: the barrier)",
    "job": "job: read + decode + transform + encode + produce (one stage)",
    "precommit": "pre-commit (ledger record + flush), slowest slot",
    "decide": "decide (commit decision recorded)",
    "commit": "commit (slots' commit_transaction, reported)",
    "driver": "driver (foreachBatch around the protocol)",
    "mark": "mark committed (Spark commit log)",
    "other": "other (Spark trigger overhead)",
}


def protocol(results: dict[str, Any]) -> list[str]:
    section, out = opening(results, "protocol", "3. Protocol cost per epoch")
    # The producer and transactions sections measure parts of an epoch on their own: shown even
    # when they ran without the epochs (`--sections producer,transactions`).
    alone = producer_startup(results) + transaction_cost(results)
    if section is None:
        return out + alone
    if not section.get("sets"):
        return [*out, "_No epochs to analyse (run the throughput and latency sections)._", "", *alone]
    out += [
        "Where an epoch's time goes, from eos's own per-slot timings and Spark's progress (the epochs of the",
        "stateless runs of sections 1 and 2). Baseline: the epoch's `triggerExecution`; each share is the phase's",
        "total over the epoch time's total (epochs with records only). The slot phases are those of the slot that",
        "finished last. Since the rewrite there is no shuffle and no barrier stage: a slot is a partition of the",
        "epoch's rows, its writer runs in the read task, and the commit runs on a thread of the slot's Python worker",
        "once the driver has recorded the decision.",
        "",
    ]
    sets = section["sets"]

    def row(label: str, cell: Any) -> list[str]:
        """`label`, then `cell(set)` for every set of epochs (– for a set without epochs)."""
        return [label] + [cell(s) if s.get("epochs") else "–" for s in sets.values()]

    rows = [
        row(PHASE_NAMES[phase], lambda s, p=phase: f"{s['share_pct'][p]:.1f}% / {s['median_ms'][p]:,.1f}")
        for phase in PHASES
    ]
    rows += [
        row(
            "transactional id lease + init (slowest slot; 0 when a live producer was reused)",
            lambda s: f"{s['init_share_pct']:.1f}% / {s['init_ms']:,.1f} (max {s['init_max_ms']:,.0f})",
        ),
        row("epoch time, median [min–max]", lambda s: span(s["epoch_s"], 2, " s")),
        row("records per epoch (median)", lambda s: n(s["records_per_epoch"]["median"])),
        ["epochs"] + [str(s.get("epochs", 0)) for s in sets.values()],
        row("sink producers created / reused", lambda s: f"{s['producers_created']} / {s['producers_reused']}"),
    ]
    header_row = ["phase"] + [f"{name}: share / median ms" for name in sets]
    out += table(header_row, rows)
    out += alone
    agreement = section.get("agreement_ms")
    if agreement:
        out += [
            f"**Decision + commit** (recording the decision durably, then every slot's commit reported back), "
            f"over {agreement['epochs']} exactly-once epochs: p50 **{agreement['p50']} ms**, p99 "
            f"**{agreement['p99']} ms**, max {agreement['max']} ms (the old agreement target was ≤ 100 ms: "
            f"**{'met' if agreement['p99'] <= 100 else 'MISSED'}**).",
            "",
        ]
    return out


def producer_startup(results: dict[str, Any]) -> list[str]:
    section = results.get("producer")
    if not section or "error" in section:
        return []
    rows = []
    plain = section["summary"]["as eos does it"]
    for variant, s in section["summary"].items():
        rows.append(
            [
                variant,
                f"{s['median_ms']:.0f} ms",
                f"{s['p90_ms']:.0f} ms",
                f"{s['max_ms']:.0f} ms",
                f"{s['over_400ms']} of {section['rounds']}",
                "as eos does it",
                f"{s['median_ms'] / plain['median_ms']:.2f}× (p90 {s['p90_ms'] / plain['p90_ms']:.2f}×)",
            ]
        )
    return [
        "**A fresh sink producer** (`bench/sections/producer.py`): `init_transactions` on a new transactional "
        "producer when a slot lands on another Python worker, as eos does it (`producer()` connects every broker "
        "at creation, then `connect()` makes two metadata requests, so that a broker learned from metadata is up "
        "before the producer-id request), with one metadata request first (eos until 2026-11-24), with none, and "
        "with librdkafka's default sparse connections (eos before 2026-11-23), alternated on the same ids:",
        "",
        *table(["variant", "median", "p90", "max", "> 400 ms", "baseline", "ratio"], rows),
    ]


def transaction_cost(results: dict[str, Any]) -> list[str]:
    """The broker CPU of an exactly-once epoch's transactions (bench/sections/transactions.py),
    beside what the throughput section measured: exactly-once's broker CPU over at-least-once's."""
    section = results.get("transactions")
    if not section or "error" in section:
        return []
    summary = section["summary"]
    base = summary["idempotent"]["broker_cpu_ms"]
    rows = [
        [
            shape,
            f"{v['broker_cpu_ms']:.1f} ms [{v['low']:.1f}–{v['high']:.1f}]",
            f"{v['client_ms']:.1f} ms",
            "idempotent" if shape != "idempotent" else "–",
            f"{v['broker_cpu_ms'] / base:.2f}×" if shape != "idempotent" and base > 0 else "–",
        ]
        for shape, v in summary.items()
    ]
    out = [
        f"**What transactions cost the broker** (`bench/sections/transactions.py`): the shapes of an epoch's "
        f"writes produced alone with the sink's producer settings, {section['units']} of each per block, "
        f"{section['rounds']} alternating rounds after {section.get('warmup_rounds', 0)} discarded ones; broker "
        "CPU from /proc per unit, the round's idle block subtracted. "
        f"A slot's share is {section['records_per_slot']:,} records over {section['partitions']} partitions "
        "(idempotent: at-least-once's slot; in a transaction with one record on the ledger's partition: "
        "exactly-once's slot); the decision is one record in a transaction:",
        "",
        *table(["shape", "broker CPU per unit", "client time per unit", "baseline", "ratio"], rows),
    ]
    line = (
        f"An exactly-once epoch ({section['slots']} slot transactions and the decision) so adds "
        f"**~{section['epoch_extra_ms']:.0f} ms** of broker CPU over an at-least-once one (median of the rounds' "
        f"own differences, {section.get('epoch_extra_low_ms', section['epoch_extra_ms']):.0f}–"
        f"{section.get('epoch_extra_high_ms', section['epoch_extra_ms']):.0f} ms)"
    )
    measured = _broker_cpu_per_epoch(results)
    if measured is not None:
        line += (
            f"; the throughput section measured **{measured:.0f} ms** per epoch (exactly-once's broker CPU over "
            "at-least-once's, stateless, median of the paired rounds over the epochs)"
        )
    return [*out, line + ".", ""]


def _broker_cpu_per_epoch(results: dict[str, Any]) -> float | None:
    try:
        runs = results["throughput"]["pipelines"]["stateless"]["runs"]
        eo, alo = runs[EO], runs[ALO]
    except (KeyError, TypeError):
        return None
    diffs = [
        (a["cpu"]["broker"] - b["cpu"]["broker"]) * 1e3 / max(1, len(a["epochs"]))
        for a, b in by_round(eo, alo)
        if "cpu" in a and "cpu" in b
    ]
    return summarize(diffs).median if diffs else None


@titled("costmodel", "13. Cost model: slots, sinks, partitions, pools")
def costmodel(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """The cost model's figures and fitted lines (bench/sections/costmodel.py renders them; the
    projection and the first bottleneck are argued in docs/SCALING.md)."""
    from bench.sections.costmodel import render

    return [*render(section), "", "The model's projection to a 64-executor cluster: docs/SCALING.md.", ""]

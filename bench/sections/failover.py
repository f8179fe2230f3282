"""Failover: kill -9 of the running driver, to the first epoch committed after it, with a hot
standby (`eos run --standby`) against a cold restart (the same command again).

Each round runs the stateless pipeline twice on the recovery section's input (epochs of
`recovery_epoch_records`), in an order that alternates between rounds. The driver is started with
two failpoints: `epoch.after_offsets_logged=pause@epoch=2`, which holds it inside epoch 2 until the
benchmark releases it, and `sink.after_precommit=kill@epoch=2`, which then kills its process group
(driver, Spark JVM, Python workers) with epoch 2 pre-committed and undecided: the epoch must be
replayed, as after most real crashes. Hot: a standby is started while the driver holds, and the
driver is released once the standby says it is standing by (Spark up, plan built, Python workers
warm). Cold: the driver is released alone, and the same command is started again as soon as the
killed process group is gone (what a supervisor restarting it at once would do). Both figures run
from the kill (when the killed processes' output closed: the failpoint prints its line, waits
0.5 s for the JVM to forward it, then kills) to the first new file in the checkpoint's commit log,
polled every 20 ms. The output is checked after the run that took over drained the input: exactly
the expected records. Every round records the load average at its kill.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from bench.context import Bench
from bench.inputs import count_records, delete_topics, eos_topics, expected_stateless_out
from bench.pipelines import stateless_config, unique
from bench.subproc import EosProcess, committed_epochs, wait_committed, wait_group_gone

KILL_EPOCH = 2
KINDS = ("hot", "cold")


def one_run(bench: Bench, kind: str, expected: int, topic: str) -> dict[str, Any]:
    from eos.failpoints import release

    name = unique(f"bench-failover-{kind}")
    out_topic = f"{name}-out"
    checkpoint = bench.checkpoint(name)
    config = stateless_config(
        name=name,
        bootstrap=bench.bootstrap,
        topic=topic,
        out_topic=out_topic,
        checkpoint=checkpoint,
        mode="exactly-once",
        epoch_records=bench.plan.recovery_epoch_records,
    )
    pipeline_file = bench.work / f"{name}.yaml"
    pipeline_file.write_text(yaml.safe_dump(config, sort_keys=False))
    logs = bench.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    hold = f"epoch.after_offsets_logged=pause(600)@epoch={KILL_EPOCH}"
    kill = f"sink.after_precommit=kill@epoch={KILL_EPOCH}"
    active = EosProcess(pipeline_file, "--failpoint", hold, "--failpoint", kill, log=logs / f"{name}-active.log")
    taker: EosProcess | None = None
    try:
        if wait_committed(active, checkpoint, KILL_EPOCH - 1, timeout=300) is None:
            raise RuntimeError(f"the driver did not reach epoch {KILL_EPOCH}:\n{active.tail()}")
        if kind == "hot":
            taker = EosProcess(pipeline_file, "--standby", log=logs / f"{name}-standby.log")
            if taker.first(r"standing by: watching", timeout=300) is None:
                raise RuntimeError(f"the standby did not stand by:\n{taker.tail()}")
        committed = committed_epochs(checkpoint)
        release(checkpoint / "_eos" / "scratch" / "failpoints")
        if active.first(r"eos failpoint: kill -9", timeout=300) is None:
            raise RuntimeError(f"the failpoint did not kill the driver:\n{active.tail()}")
        # The kill: when the killed processes' output closed (the failpoint prints its line, waits
        # 0.5 s for the JVM to forward it, then kills).
        killed = active.wait(60)
        load = os.getloadavg()[0]
        if killed is None:
            raise RuntimeError(f"the killed driver's output never closed:\n{active.tail()}")
        gone = wait_group_gone(active.pid)
        if kind == "cold":
            taker = EosProcess(pipeline_file, log=logs / f"{name}-restart.log")
        first = wait_committed(taker, checkpoint, committed, timeout=300)
        if first is None:
            raise RuntimeError(f"no epoch was committed after the kill:\n{taker.tail()}")
        judged = taker.first(r"the driver is gone", timeout=1) if kind == "hot" else None
        took = taker.first(r"took over .* running", timeout=1) if kind == "hot" else None
        if taker.wait(600) is None:
            raise RuntimeError(f"the run that took over did not drain the input:\n{taker.tail()}")
    finally:
        active.kill_group()
        if taker is not None:
            taker.kill_group()
    row: dict[str, Any] = {
        "kind": kind,
        "load_at_kill": round(load, 2),
        "kill_to_first_commit_s": first - killed,
        "kill_to_group_gone_s": gone - killed,
        "kill_to_judged_gone_s": judged - killed if judged is not None else None,
        "kill_to_took_over_s": took - killed if took is not None else None,
        "exit_code": taker.proc.returncode,
    }
    row["committed_out"] = count_records(bench.bootstrap, out_topic)
    row["expected_out"] = expected
    row["exactly_once"] = row["committed_out"] == expected
    delete_topics(bench.bootstrap, [out_topic, *eos_topics(name)])
    return row


def run(bench: Bench) -> dict[str, Any]:
    plan = bench.plan
    rounds = 1 if plan.quick else 5
    source = bench.input(plan.recovery_events, plan.partitions)
    expected = expected_stateless_out(bench.bootstrap, source.topic)
    rows = []
    for number in range(rounds):
        for kind in KINDS if number % 2 == 0 else tuple(reversed(KINDS)):
            bench.say(f"round {number + 1}/{rounds}: {kind}: kill -9 at epoch {KILL_EPOCH} ...")
            row = one_run(bench, kind, expected, source.topic)
            row["round"] = number
            rows.append(row)
            bench.say(
                f"{kind}: kill -> first commit {row['kill_to_first_commit_s']:.2f} s (load {row['load_at_kill']:.1f}); "
                + ("exactly once" if row["exactly_once"] else "WRONG output")
            )
    return {"input": source.__dict__, "epoch_records": plan.recovery_epoch_records, "runs": rows}


def report(results: dict[str, Any]) -> list[str]:
    """The section's part of docs/BENCHMARKS.md."""
    from bench.report.tables import n, opening, ratio, span, table
    from bench.stats import ratio_summary, summarize

    section, out = opening(results, "failover", "15. Failover: a hot standby against a cold restart")
    if section is None:
        return out
    runs = section["runs"]
    out += [
        f"The stateless pipeline (exactly-once, epochs of {section['epoch_records']:,} records), killed (kill -9 of "
        f"its process group) with epoch {KILL_EPOCH} pre-committed and undecided. **Hot**: `eos run --standby` was "
        "standing by; **cold**: the same command started again once the killed processes were gone. From the kill "
        "to the first epoch Spark marks committed after it (the replayed one); rounds alternate their order, and "
        "the ratio is paired within a round (bench/sections/failover.py).",
        "",
    ]
    by = {kind: [r for r in runs if r["kind"] == kind] for kind in KINDS}
    rows = []
    for kind, rs in by.items():
        first = summarize([r["kill_to_first_commit_s"] for r in rs])
        rows.append(
            [
                kind,
                span(first, 2, " s"),
                f"{first.spread_pct:.0f}%",
                span(summarize([r["kill_to_judged_gone_s"] for r in rs]), 2, " s") if kind == "hot" else "–",
                span(summarize([r["kill_to_took_over_s"] for r in rs]), 2, " s") if kind == "hot" else "–",
                ", ".join(n(r["load_at_kill"], 1) for r in rs),
                "≤ 5 s" if kind == "hot" else "",
                ("met" if first.median <= 5 else "MISSED") if kind == "hot" else "",
                "; ".join("ok" if r["exactly_once"] else f"WRONG ({r['committed_out']:,})" for r in rs),
            ]
        )
    out += table(
        [
            "",
            "kill → first committed epoch",
            "spread",
            "kill → judged gone",
            "kill → took over (recovered, query started)",
            "load average at each kill",
            "target",
            "verdict",
            "output",
        ],
        rows,
    )
    hot = {r["round"]: r["kill_to_first_commit_s"] for r in by.get("hot", [])}
    paired = [(hot[r["round"]], r["kill_to_first_commit_s"]) for r in by.get("cold", []) if r["round"] in hot]
    if paired:
        hot_over_cold = ratio_summary([h for h, _ in paired], [c for _, c in paired])
        out += [f"Hot over cold, paired by round: {ratio(hot_over_cold)}", ""]
    return out


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    """The summary's row: kill -9 to the standby's first committed epoch, against a cold restart."""
    from bench.report.tables import ratio, target
    from bench.stats import ratio_summary, summarize, verdict

    section = results.get("failover")
    if not section or "error" in section:
        return []
    by = {kind: [r for r in section["runs"] if r["kind"] == kind] for kind in KINDS}
    if not by["hot"]:
        return []
    hot = summarize([r["kill_to_first_commit_s"] for r in by["hot"]]).median
    cold = summarize([r["kill_to_first_commit_s"] for r in by["cold"]]).median if by["cold"] else None
    in_round = {r["round"]: r["kill_to_first_commit_s"] for r in by["hot"]}
    pairs = [(in_round[r["round"]], r["kill_to_first_commit_s"]) for r in by["cold"] if r["round"] in in_round]
    ok = all(r["exactly_once"] for r in section["runs"])
    return [
        target(
            "failover: kill -9 of the driver → the hot standby's first committed epoch",
            f"{hot:.2f} s" + ("" if ok else " (OUTPUT WRONG)"),
            f"cold restart {cold:.1f} s" if cold is not None else "–",
            ratio(ratio_summary([h for h, _ in pairs], [c for _, c in pairs])) if pairs else "–",
            "≤ 5 s",
            verdict(hot, 5, higher_is_better=False) if ok else "MISSED",
        )
    ]

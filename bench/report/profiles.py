"""The profiles section: where each configuration's CPU goes, by process, by step of the data path
(Python, with py-spy) and inside the Spark JVM (async-profiler)."""

from __future__ import annotations

from typing import Any

from bench.report.tables import CPU_CLASSES, n, table, titled
from bench.runs import RAW


def _side_by_side(runs: dict[str, Any], label: str, key: str) -> list[list[str]]:
    """Rows: the names under profiles[label][key] of every run; columns: the runs."""
    names: list[str] = []
    for run in runs.values():
        for name, _ in run["profiles"].get(label, {}).get(key, []):
            if name not in names:
                names.append(name)
    rows = []
    for name in names:
        cells = []
        for run in runs.values():
            found = dict(run["profiles"].get(label, {}).get(key, []))
            cells.append(f"{found[name]}%" if name in found else "–")
        rows.append([name, *cells])
    return rows


def jvm_profiler(section: dict[str, Any]) -> str:
    """How the profile section sampled the Spark JVM (runs before 2026-11-27 used JFR)."""
    if "jvm_profiler" not in section:
        return "Java Flight Recorder (`settings=profile`: Java frames only, no native code)"
    if section["jvm_profiler"] is None:
        return f"no profiler ({section.get('jvm_profiler_missing', 'unavailable')})"
    return f"{section['jvm_profiler']} (`itimer`: every thread by its CPU time, Java and native frames)"


@titled("profile", "Profiles")
def profiles(section: dict[str, Any], results: dict[str, Any]) -> list[str]:
    runs = section["runs"]
    spark_runs = {k: v for k, v in runs.items() if k != RAW}
    stateful = any(run.get("pipeline") == "stateful" for run in runs.values())
    pipelines = "stateless and stateful" if stateful else "stateless"
    out = [
        f"One run of each configuration on a warm session, {pipelines} ({section['input_records']:,} "
        f"records, epochs of {section['epoch_records']:,}): py-spy (on-CPU samples, 50 Hz, `--nonblocking`) of the "
        f"driver and of all of Spark's Python workers, {jvm_profiler(section)} of the Spark JVM, and CPU seconds per "
        "process from /proc. Profilers cost CPU too (`tools`), so these runs are slower than the measured ones. "
        "Raw stacks stay in the work folder with `python -m bench --keep`.",
        "",
        "**CPU seconds by process** during the run, and the run's wall time outside its epochs:",
        "",
    ]
    rows = []
    for config, run in runs.items():
        cpu, spans = run["cpu"], run.get("spans", {})
        rows.append(
            [
                config,
                f"{run['wall_s']:.1f} s",
                *[n(cpu.get(c, 0), 1) for c in CPU_CLASSES],
                n(spans.get("startup_s"), 1),
                n(spans.get("teardown_s"), 1),
            ]
        )
    out += table(
        [
            "configuration",
            "wall",
            "Spark JVM",
            "Python workers",
            "driver",
            "broker",
            "profilers",
            "other",
            "start-up s",
            "after last epoch s",
        ],
        rows,
    )
    steps = section.get("steps")
    if steps:
        eos_steps = ("consume", "to_arrow", "decode", "encode", "produce")
        raw_steps = ("consume", "raw: decode", "raw: transform + encode", "raw: produce")
        rows = [[k, n(v, 2)] for k, v in steps["us_per_record"].items()]
        rows.append(["eos's Python path (consume … produce)", n(sum(steps["us_per_record"][k] for k in eos_steps), 2)])
        rows.append(["the raw loop's", n(sum(steps["us_per_record"][k] for k in raw_steps), 2)])
        out += [
            f"**The data path's Python work, step by step** (bench/steps.py: one process, the pipeline's own functions "
            f"on the same {steps['records']:,} records, µs of CPU per record, least of {steps['repeats']} passes):",
            "",
            *table(["step", "µs CPU / record"], rows),
        ]
    out += ["**Spark's Python workers**: share of on-CPU samples by step (innermost matching function):", ""]
    out += table(["step", *spark_runs], _side_by_side(spark_runs, "workers", "steps"))
    how = (
        "share of CPU samples by step (the JIT compilers' and the garbage collector's threads by their name, every "
        "other thread by its innermost matching frame, Java or native)"
        if "jvm_profiler" in section
        else "JFR execution samples of Java threads by step (innermost matching frame)"
    )
    out += [f"**Spark JVM**: {how}:", ""]
    out += table(["step", *spark_runs], _side_by_side(spark_runs, "spark_jvm", "steps"))
    out += ["**Spark JVM** by thread:", ""]
    out += table(["thread", *spark_runs], _side_by_side(spark_runs, "spark_jvm", "threads"))
    for config, run in runs.items():
        out += [f"<details><summary>Top frames: {config}</summary>", ""]
        for label, prof in run["profiles"].items():
            if prof.get("samples"):
                out += [f"{label} ({prof['samples']:,} samples), self time:", ""]
                out += table(["function", "share"], [[f"`{f}`", f"{v}%"] for f, v in prof["self"][:10]])
        out += ["</details>", ""]
    return out

"""The report's building blocks: numbers as text, medians with their spread, markdown tables, a
section's heading (or why it has no figures), the CPU table, and a target row of the summary."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from bench.stats import summarize

Rows = list[dict[str, Any]]


def n(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _spread(summary: dict[str, Any] | Any, text: Any, suffix: str) -> str:
    s = summary if isinstance(summary, dict) else summary.to_dict()
    if not s.get("n"):
        return "–"
    if s["n"] == 1:
        return f"{text(s['median'])}{suffix}"
    return f"{text(s['median'])}{suffix} [{text(s['low'])}–{text(s['high'])}]"


def span(summary: dict[str, Any] | Any, digits: int = 0, unit: str = "") -> str:
    """'median [min–max]' (or the median alone for one run)."""
    return _spread(summary, lambda v: n(v, digits), unit)


def ratio(summary: dict[str, Any] | Any) -> str:
    """'1.02× [0.95–1.10]' (or the median alone for one run)."""
    return _spread(summary, lambda v: f"{v:.2f}", "×")


def span_of(rows: Rows, key: str, digits: int = 0, unit: str = "") -> str:
    """`key` over runs, as span() writes it."""
    return span(summarize([r.get(key) for r in rows]), digits, unit)


def median_of(rows: Rows, key: str) -> float:
    return summarize([r.get(key) for r in rows]).median


def cpu_cell(rows: Rows) -> str:
    return span_of(rows, "cpu_us_per_record", 1)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def failed(section: dict[str, Any] | None, name: str) -> list[str] | None:
    """Why a section has no figures (not run, or failed), or None."""
    if section is None:
        return [f"_Not run in this invocation (`python -m bench --sections {name}`)._", ""]
    if "error" in section:
        return [f"**This section failed:** `{section['error']}`", "", "```", section.get("traceback", ""), "```", ""]
    return None


def opening(results: dict[str, Any], name: str, title: str) -> tuple[dict[str, Any] | None, list[str]]:
    """A section's results and its heading; None instead of the results when it has no figures
    (the lines then say why)."""
    section = results.get(name)
    out = [f"## {title}", ""]
    problem = failed(section, name)
    return (None, out + problem) if problem else (section, out)


Text = Callable[[dict[str, Any], dict[str, Any]], list[str]]


def titled(name: str, title: str) -> Callable[[Text], Callable[[dict[str, Any]], list[str]]]:
    """A section's text from all the results: its heading, then `text(section, results)`, or why
    there are no figures when it failed or did not run."""

    def wrap(text: Text) -> Callable[[dict[str, Any]], list[str]]:
        @functools.wraps(text)
        def render(results: dict[str, Any]) -> list[str]:
            section, out = opening(results, name, title)
            return out if section is None else out + text(section, results)

        return render

    return wrap


CPU_CLASSES = ("spark_jvm", "python_workers", "driver", "broker", "tools", "other")


def cpu_table(runs: dict[str, Rows]) -> list[str]:
    rows = []
    for config, rs in runs.items():
        if not rs:
            continue
        per = {c: summarize([r["cpu"].get(c, 0) / r["records_in"] * 1e6 for r in rs]).median for c in CPU_CLASSES}
        busy = summarize(
            [(sum(r["cpu"].get(c, 0) for c in CPU_CLASSES)) / (r["cpu"]["wall_s"] * r["cpu"]["cores"]) for r in rs]
        ).median
        jit = [r["cpu"]["spark_jit"] / r["records_in"] * 1e6 for r in rs if "spark_jit" in r["cpu"]]
        jit_text = n(summarize(jit).median, 1) if jit else "–"
        rows.append(
            [config, n(per["spark_jvm"], 1), jit_text, *[n(per[c], 1) for c in CPU_CLASSES[1:]], f"{n(100 * busy)}%"]
        )
    return [
        "CPU per record, µs of CPU time per input record by process (median over runs; `other` is the rest of the",
        "machine: other engineers' processes). `busy` is how much of both cores was in use during the run. `of which",
        "JIT` is the part of the Spark JVM's CPU that its JIT compiler threads used during the run (a lower bound).",
        "",
        *table(
            ["configuration", "Spark JVM", "of which JIT", "Python workers", "driver (Python)", "broker",
             "tools / peers", "other", "busy"],
            rows,
        ),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The summary's rows (bench.report.summary): each section's module says what its targets are
# ---------------------------------------------------------------------------------------------


def target(name: str, measured: str, baseline: str, value: str, goal: str, verdict: str) -> dict[str, str]:
    return dict(name=name, measured=measured, baseline=baseline, value=value, target=goal, verdict=verdict)


def cpu_text(rows: Rows) -> str:
    cpu = summarize([r.get("cpu_us_per_record") for r in rows])
    return f", {cpu.median:,.1f} µs CPU/rec" if cpu.n else ""


def rate_text(rows: Rows, key: str = "rps_wall", unit: str = "rec/s") -> str:
    s = summarize([r.get(key) for r in rows])
    spread = f" [{s.low:,.0f}–{s.high:,.0f}]" if s.n > 1 else ""
    return f"{s.median:,.0f}{spread} {unit}{cpu_text(rows)}"

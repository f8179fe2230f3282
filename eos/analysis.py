"""What Spark would refuse when the query starts, asked before anything is written, and Spark's
error texts made readable.

- The output mode against the plan (an aggregation without a watermark cannot run in append
  mode, ...): Spark checks it only in `writeStream.start()`, after eos has fenced the previous
  driver and written the checkpoint's metadata; `check_output_mode` asks Spark's own checker
  (UnsupportedOperationChecker) on the plan first.
- Spark's messages: a ParseException's text starts with a newline (the first line is empty), an
  AnalysisException's goes on with the whole logical plan, and both give positions inside the
  SQL text. `spark_message` keeps what says something; `sql_problem` adds where in the SQL (and,
  for a pipeline file, on which line of the file) the problem is.
"""

from __future__ import annotations

import re
from typing import Any

from eos.errors import ConfigError

_POSITION = re.compile(r"\(?line (\d+),? pos (\d+)\)?")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+;?")


def spark_message(exc: BaseException) -> str:
    """The first line of a Spark error that says something, without its SQLSTATE and position."""
    for line in str(exc).splitlines():
        line = _POSITION.sub("", _SQLSTATE.sub("", line)).strip().rstrip(";").strip()
        if line:
            return line
    return type(exc).__name__


def sql_position(exc: BaseException) -> tuple[int, int] | None:
    """(line, column) inside the SQL text where Spark located the error, 1-based, if it did."""
    match = _POSITION.search(str(exc))
    return (int(match.group(1)), int(match.group(2)) + 1) if match else None


def sql_pointer(exc: BaseException) -> str:
    """The SQL with Spark's marker under the error (a ParseException's `== SQL ==` part), indented."""
    text = str(exc)
    if "== SQL ==" not in text:
        return ""
    shown = [line for line in text.split("== SQL ==", 1)[1].splitlines() if line.strip()]
    return "\n".join("    " + line for line in shown[:12])


def sql_problem(what: str, exc: BaseException, where: str | None, file_line: int | None) -> ConfigError:
    """A ConfigError for an error in a transform's SQL: the file's line of the problem when known."""
    position = sql_position(exc)
    place = where or ""
    if file_line is not None and where is not None:
        place = f"{where.rsplit(':', 1)[0]}:{file_line}"
    detail = f" (SQL line {position[0]}, column {position[1]})" if position else ""
    message = f"{place + ': ' if place else ''}{what}: {spark_message(exc)}{detail}"
    pointer = sql_pointer(exc)
    return ConfigError(f"{message}\n{pointer}" if pointer else message)


def check_output_mode(spark: Any, stream: Any, output_mode: str) -> None:
    """Spark's own check of the output mode against the plan (what `writeStream.start()` would
    refuse), raised as a ConfigError that says what to change."""
    jvm = spark._jvm
    modes = jvm.org.apache.spark.sql.streaming.OutputMode
    mode = {"append": modes.Append(), "update": modes.Update(), "complete": modes.Complete()}[output_mode]
    try:
        jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker.checkForStreaming(
            stream._jdf.queryExecution().analyzed(), mode
        )
    except Exception as exc:
        message = spark_message(exc)
        hint = None
        if "without watermark" in message or "watermark" in message.lower():
            hint = (
                "aggregations in append mode emit a group only once the watermark has passed it: give the source a "
                "`watermark:` (column, delay) and group by a window of that column, or set `epochs.output_mode: "
                "update` (each epoch writes the groups it changed; upsert sinks keep the last value per key)"
            )
        elif output_mode == "update":
            hint = "this plan may need `epochs.output_mode: append`"
        raise ConfigError(f"output mode {output_mode}: {message}", hint=hint) from None

"""Pre-flight: what can be checked about a pipeline file before Spark starts (tens of seconds on a
cold machine), so that an ordinary mistake is reported in seconds, with the file's line and the
fix, and nothing is left behind.

`eos check` runs every check and prints each outcome; `eos run` runs the same checks first and
stops at the first problem. Without Spark:
  - the Python transforms import (the pipeline file's folder is on the path);
  - the checkpoint location can be written (a local one: the folder, or the nearest existing
    parent it would be made in);
  - every source and sink checks its system (the connector's `check`: brokers reachable, topics
    exist, the database connects and allows prepared transactions, ...).
With Spark (`eos check` starts a small local one; `eos run` does it as it builds the query): the
SQL parses and resolves against the sources' schemas, sinks' keys are columns of their input, and
the output mode fits the plan's aggregations and watermarks (eos.analysis).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eos.config import PipelineConfig
from eos.declared import connectors, pipeline_info
from eos.errors import ConfigError, EnvironmentProblem, EosError
from eos.protocol.checkpoint import is_local, local_path
from eos.yamlpipeline import located


@dataclass
class Finding:
    what: str
    error: EosError | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def checks(
    config: PipelineConfig, base_dir: Path | None, opened: list[object]
) -> Iterator[tuple[str, Callable[[], str]]]:
    """(what, check) pairs; a check returns a detail line or raises an EosError naming the line."""
    for index, transform in enumerate(config.transforms):
        if transform.python:
            yield (
                f"transform {transform.name}: python {transform.python}",
                lambda t=transform, i=index: _imports(config, base_dir, t.python, i),
            )
    yield f"checkpoint {config.checkpoint}", lambda: _checkpoint_writable(config, base_dir)
    found = connectors(config, pipeline_info(config, "(pre-flight)", base_dir))
    opened += [*found.sources, *found.sinks]
    entries = [("sources", i, s) for i, s in enumerate(found.sources)]
    entries += [("sinks", i, s) for i, s in enumerate(found.sinks[: len(config.sinks)])]
    # A source's dead-letter queue is a sink of its own (its topic, its transactional ids, its ACLs).
    by_name = {source.name: i for i, source in enumerate(found.sources)}
    entries += [("sources", by_name[s.name.removesuffix(".dlq")], s) for s in found.sinks[len(config.sinks) :]]
    for kind, index, connector in entries:
        label = f"{'sink' if kind == 'sinks' or connector.name.endswith('.dlq') else 'source'} {connector.name}"
        yield label, lambda k=kind, i=index, c=connector: _connector(config, k, i, c)
    if config.exactly_once and found.sources:
        yield f"pipeline name {config.name}", lambda: _name_is_ours(config, base_dir, found.sources[0])


def run_checks(config: PipelineConfig, base_dir: Path | None, stop_at_first: bool) -> list[Finding]:
    findings: list[Finding] = []
    opened: list[object] = []
    try:
        for what, check in checks(config, base_dir, opened):
            try:
                findings.append(Finding(what, detail=check()))
            except EosError as exc:
                if stop_at_first:
                    raise
                findings.append(Finding(what, exc))
            except Exception as exc:  # a system's answer no check expected: reported, never a traceback
                problem = EnvironmentProblem(f"{what}: {type(exc).__name__}: {str(exc)[:500]}")
                if stop_at_first:
                    raise problem from exc
                findings.append(Finding(what, problem))
    finally:
        for connector in opened:
            connector.close()  # type: ignore[attr-defined]
    return findings


def analyse(config: PipelineConfig, base_dir: Path | None, spark: object = None) -> Finding:
    """Build the query's plan on Spark without running it: the SQL against the sources' schemas,
    the sinks' columns and keys, the output mode against the plan."""
    from eos.analysis import check_output_mode
    from eos.yamlpipeline import build_pipeline

    what = "the query's plan (SQL, columns, keys, output mode)"
    try:
        pipeline = build_pipeline(config, base_dir, spark)
    except EosError as exc:
        return Finding(what, exc)
    try:
        stream, _ = pipeline.union()
        check_output_mode(pipeline.spark, stream, config.epochs.output_mode)
    except EosError as exc:
        where = config.where(("epochs", "output_mode")) or config.where(("epochs",)) or config.where(())
        return Finding(what, located(exc, where))
    finally:
        pipeline.close()
    return Finding(what, detail=f"{len(config.sinks)} sink(s), output mode {config.epochs.output_mode}")


def _imports(config: PipelineConfig, base_dir: Path | None, reference: str, index: int) -> str:
    import importlib.util

    if base_dir is not None and str(base_dir.resolve()) not in sys.path:
        sys.path.insert(0, str(base_dir.resolve()))
    # Found, not imported: a module may need Spark to import (a UDF declared with a DDL type
    # string), and its own errors are reported, with the line, when the pipeline is built.
    module_name = reference.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        spec, problem = None, str(exc)
    else:
        problem = f"No module named {module_name!r}"
    if spec is None:
        hint = (
            f"modules are found in the pipeline file's folder ({base_dir}) and on the Python path; put "
            f"{module_name}.py beside the pipeline file, or install it"
            if base_dir is not None
            else None
        )
        problem_error = ConfigError(f"python transform {reference!r}: cannot import {module_name!r}: {problem}", hint)
        raise located(problem_error, config.where(("transforms", index, "python")))
    return f"found at {spec.origin}"


def _checkpoint_writable(config: PipelineConfig, base_dir: Path | None) -> str:
    location = config.checkpoint_path(base_dir)
    if not is_local(location):
        return f"{location} (checked when Spark starts)"
    path = local_path(location)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    where = config.where(("checkpoint",))
    if not existing.is_dir():
        raise located(
            EnvironmentProblem(
                f"checkpoint {location}: {existing} is not a folder",
                hint="choose a checkpoint location in a folder eos can create and write",
            ),
            where,
        )
    if not _can_write(existing):
        made = "" if existing == path else f" (the checkpoint would be made in {existing})"
        raise located(
            EnvironmentProblem(
                f"checkpoint {location}: {existing} is not writable by this user{made}",
                hint="choose a writable checkpoint location, or give this user write access to it",
            ),
            where,
        )
    return f"{path} ({'exists' if path.exists() else 'will be created'}, writable)"


def _name_is_ours(config: PipelineConfig, base_dir: Path | None, source: object) -> str:
    """A new local checkpoint must not take a name another checkpoint's pipeline runs under
    (eos.startup.check_name_is_ours); a remote checkpoint is checked when Spark has started."""
    from eos.protocol.checkpoint import Checkpoint
    from eos.startup import OpenedCheckpoint, check_name_is_ours

    location = config.checkpoint_path(base_dir)
    if not is_local(location):
        return "checked when Spark starts"
    checkpoint = Checkpoint(location)
    if checkpoint.files.exists("_eos/pipeline.json"):
        return "this checkpoint's"
    control = source.control_log()  # type: ignore[attr-defined]
    try:
        previous = control.previous_driver()
    finally:
        control.close()
    try:
        check_name_is_ours(OpenedCheckpoint(checkpoint, None, "(new)", None), previous, config.name)
    except EosError as exc:
        raise located(exc, config.where(("name",))) from None
    return "not used by another checkpoint"


def _can_write(folder: Path) -> bool:
    """Whether a file can be made in `folder`: tried, not guessed from the mode bits (root passes
    every access check, and a read-only or pseudo filesystem refuses what the bits allow)."""
    import tempfile

    try:
        made = tempfile.mkdtemp(prefix=".eos-check-", dir=folder)
    except OSError:
        return False
    os.rmdir(made)
    return True


def _connector(config: PipelineConfig, kind: str, index: int, connector: object) -> str:
    try:
        connector.validate()  # type: ignore[attr-defined]
        connector.check(None)  # type: ignore[attr-defined]
    except EosError as exc:
        raise located(exc, config.where((kind, index))) from None
    return connector.describe()  # type: ignore[attr-defined]

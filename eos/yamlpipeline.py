"""The pipeline file as a front end to `eos.Pipeline`: the same sources and sinks, declared from
the file's entries, with its transforms in between.

sources -> decoded, watermarked SQL views (named as the sources) -> transforms, each a view of
its own: `sql:` over the views, or `python: module:function` called with its input view's
DataFrame (and `args`) -> each sink takes its `input:` view (default: the last one).

Every check of an entry runs before any view is built, so that what is wrong with the systems
(a topic, a database) is reported before what is wrong with the SQL; every error names the file's
line of the entry it is about (for SQL, the line inside the SQL text).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eos.analysis import spark_message, sql_position, sql_problem
from eos.config import PipelineConfig
from eos.declared import load_function
from eos.errors import ConfigError, EosError
from eos.pipeline import Pipeline


def build_pipeline(
    config: PipelineConfig,
    base_dir: Path | None,
    spark: Any = None,
    failpoints: list[str] | None = None,
    prechecked: bool = False,
    parallelism: int | None = None,
) -> Pipeline:
    """The pipeline a file declares, built on `spark` (a new session of it). `prechecked`: the
    pre-flight (eos.preflight) just checked every source's and sink's system: not again.
    `parallelism`: slots per epoch when the file leaves `slots` unset (a standby's: eos.standby)."""
    pipeline = Pipeline.from_header(config, base_dir, spark, failpoints or [], parallelism)
    try:
        ship_modules(pipeline.spark, base_dir, [t.python for t in config.transforms if t.python])
        for kind, entries in (("sources", config.sources), ("sinks", config.sinks)):
            for index, entry in enumerate(entries):
                with at(config, (kind, index)):
                    pipeline.check(entry, systems=not prechecked)
        for index, entry in enumerate(config.sources):
            with at(config, ("sources", index)):
                pipeline.source(entry).createOrReplaceTempView(entry.name)
        pipeline.transforms = list(config.transforms)
        _transforms(pipeline.spark, config)
        for index, entry in enumerate(config.sinks):
            with at(config, ("sinks", index)):
                pipeline.sink(pipeline.spark.table(config.sink_input(entry)), entry)
    except BaseException:
        pipeline.close()
        raise
    return pipeline


@contextlib.contextmanager
def at(config: PipelineConfig, path: tuple[str | int, ...]) -> Iterator[None]:
    """Errors raised here name the file's line of `path` (errors that name a line already keep it)."""
    try:
        yield
    except EosError as exc:
        raise located(exc, config.where(path)) from None


def located(exc: EosError, where: str | None) -> EosError:
    if where is None or exc.message.startswith(where.split(":", 1)[0] + ":"):
        return exc
    return type(exc)(f"{where}: {exc.message}", exc.hint)


def ship_modules(spark: Any, base_dir: Path | None, references: list[str]) -> None:
    """Python transforms' modules that live beside the pipeline file: importable on the driver (the
    file's folder goes first on sys.path) and shipped to the executors (SparkContext.addPyFile: a
    module file as it is, a package as a zip), in local mode and on a cluster alike. Modules found
    elsewhere (installed, or shipped with spark-submit --py-files) are left as they are."""
    import sys

    if base_dir is None or not references:
        return
    folder = str(base_dir.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    shipped: set[str] = set()
    for reference in references:
        top = reference.partition(":")[0].split(".")[0]
        if top in shipped:
            continue
        module_file, package_dir = base_dir / f"{top}.py", base_dir / top
        if module_file.is_file():
            spark.sparkContext.addPyFile(str(module_file))
        elif (package_dir / "__init__.py").is_file():
            spark.sparkContext.addPyFile(_zipped(package_dir))
        else:
            continue
        shipped.add(top)


def _zipped(package_dir: Path) -> str:
    import tempfile
    import zipfile

    target = Path(tempfile.mkdtemp(prefix="eos-pyfiles-")) / f"{package_dir.name}.zip"
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(package_dir.rglob("*.py")):
            archive.write(path, path.relative_to(package_dir.parent).as_posix())
    return str(target)


def _transforms(spark: Any, config: PipelineConfig) -> None:
    previous = config.sources[-1].name
    for index, transform in enumerate(config.transforms):
        what = f"transform {transform.name!r}"
        if transform.sql is not None:
            path: tuple[str | int, ...] = ("transforms", index, "sql")
            try:
                result = spark.sql(transform.sql)
            except Exception as exc:
                position = sql_position(exc)
                loaded = config.loaded
                line = loaded.text_line(path, position[0]) if loaded is not None and position else None
                raise sql_problem(what, exc, config.where(path), line) from None
        else:
            path = ("transforms", index, "python")
            with at(config, path):
                function = load_function(str(transform.python))
            try:
                result = function(spark.table(transform.input or previous), **transform.args)
            except EosError as exc:
                raise located(exc, config.where(path)) from None
            except Exception as exc:
                raise located(
                    ConfigError(f"{what}: {type(exc).__name__}: {spark_message(exc)}"), config.where(path)
                ) from exc
        if not getattr(result, "isStreaming", False):
            raise located(
                ConfigError(f"{what} must return a streaming DataFrame derived from its input"), config.where(path)
            )
        result.createOrReplaceTempView(transform.name)
        previous = transform.name

"""The S3A connector (hadoop-aws) for a checkpoint on s3a://, added to the Spark that eos starts.

PySpark's wheel carries Hadoop's client but none of its object-store connectors. For a pipeline
whose checkpoint is on s3a://, eos resolves hadoop-aws and the AWS SDK modules it uses from
Maven Central once (`ops/s3/s3a/pom.xml`, cached under $EOS_HOME/s3a/<hash of the pom>/libs by
the jar cache the local broker's jars go through) and names those jars in `spark.jars` of the
session it starts: on the driver's classpath, and shipped to executors on a cluster. hadoop-aws
must be the version of PySpark's Hadoop client exactly (its classes extend that client's), so a
mismatch is refused with the reason.

Nothing is added when the jars come another way: a hadoop-aws jar in Spark's own jars folder, or
one named by the pipeline's spark.jars, spark.jars.packages or spark.driver.extraClassPath. A
JVM eos does not start (spark-submit, the Python API's session) brings its own (docs/S3.md).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, ops_dir

Progress = Callable[[str], None]

SCHEME = "s3a://"
# Where a session's settings may already bring hadoop-aws.
_NAMING_SETTINGS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")


def pom() -> Path:
    return ops_dir() / "s3" / "s3a" / "pom.xml"


def hadoop_aws_version() -> str:
    """The hadoop-aws version the pom pins (the one place it is written)."""
    match = re.search(r"<hadoop.version>([^<]+)</hadoop.version>", pom().read_text())
    return match.group(1) if match else "unknown"


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def bundled_hadoop_version() -> str | None:
    """The version of the Hadoop client PySpark bundles (pyspark/jars/hadoop-client-api-*.jar)."""
    for jar in spark_jars_dir().glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    return None


def provided(settings: Mapping[str, str]) -> bool:
    """Whether the session gets hadoop-aws without eos: from Spark's jars folder or its settings."""
    if any(spark_jars_dir().glob("hadoop-aws-*.jar")):
        return True
    return any("hadoop-aws" in settings.get(key, "") for key in _NAMING_SETTINGS)


def connector_jars(progress: Progress) -> list[str]:
    """The connector's jars (fetched on first use), after checking they fit PySpark's Hadoop."""
    bundled, pinned = bundled_hadoop_version(), hadoop_aws_version()
    if bundled != pinned:
        raise EnvironmentProblem(
            f"PySpark bundles Hadoop {bundled}, and the S3A connector eos adds for an s3a:// checkpoint is "
            f"hadoop-aws {pinned} ({pom()}): the two must be the same version",
            hint=f"set hadoop.version in {pom()} to {bundled} (and the AWS SDK version that hadoop-aws release "
            "names), or run on the PySpark eos was released with",
        )
    libs = _fetch_jars(pom(), eos_home() / "s3a", f"S3A connector (hadoop-aws {pinned})", progress)
    return sorted(str(jar) for jar in libs.glob("*.jar"))


def _fetch_jars(pom: Path, cache_root: Path, what: str, progress: Progress) -> Path:
    """The jar cache of eos's operational tools (eos_ops.jvm.fetch_jars: Maven, once per pom), found
    through the entry point group `eos.tools` as the CLI finds their commands: the core never
    imports them."""
    found = entry_points(group="eos.tools", name="fetch_jars")
    if not found:
        raise EnvironmentProblem(
            "eos's operational tools (eos_ops) are not installed: they fetch the S3A connector's jars",
            hint="install eos as a whole (pip install eos), or put hadoop-aws on Spark's classpath yourself",
        )
    fetch = next(iter(found)).load()
    return fetch(pom, cache_root, what, progress)


def _say(message: str) -> None:
    print(f"eos: {message}", file=sys.stderr, flush=True)


def with_connector(settings: Mapping[str, str], checkpoint: str | None, progress: Progress = _say) -> dict[str, str]:
    """`settings` with the connector's jars added to spark.jars, for a checkpoint on s3a:// that
    has no hadoop-aws otherwise; else `settings` as they are."""
    if checkpoint is None or not checkpoint.startswith(SCHEME) or provided(settings):
        return dict(settings)
    jars = [*filter(None, [settings.get("spark.jars", "").strip(", ")]), *connector_jars(progress)]
    return {**settings, "spark.jars": ",".join(jars)}

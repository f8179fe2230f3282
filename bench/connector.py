"""Spark's built-in Kafka connector jars, resolved from Maven Central once (like ops/kafka/pom.xml).

The connector must match PySpark's version; when Maven Central has no spark-sql-kafka-0-10 of
that version (PySpark 4.3.0 here: checked on repo1.maven.org), the pom's fallback version is
used and the report says so. Only jars PySpark does not already ship are passed to spark.jars:
two copies of a class on the classpath would make the comparison about class loading.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home

MAVEN_DIR = Path(__file__).resolve().parent / "maven"


@dataclass(frozen=True)
class ConnectorJars:
    version: str  # spark-sql-kafka-0-10 version used
    token_version: str
    wanted: str  # PySpark's version
    jars: list[str]

    @property
    def matches_pyspark(self) -> bool:
        return self.version == self.wanted


def _fallback(name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</", (MAVEN_DIR / "pom.xml").read_text())
    assert match, f"{name} missing from bench/maven/pom.xml"
    return match.group(1)


def _pyspark_jar_names() -> set[str]:
    import pyspark

    folder = Path(pyspark.__file__).parent / "jars"
    return {_artifact(p.name) for p in folder.glob("*.jar")}


def _artifact(jar: str) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients' (the name without its version)."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


def _resolve(version: str, token_version: str, say) -> Path | None:
    cache = eos_home() / "bench" / "spark-kafka" / f"{version}-{token_version}"
    libs = cache / "libs"
    if (cache / ".complete").exists():
        return libs
    missing = cache / ".missing"
    if missing.exists() and time.time() - missing.stat().st_mtime < 86400:
        return None  # looked up less than a day ago: Maven Central did not have it
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
    say(f"fetching spark-sql-kafka-0-10_2.13:{version} from Maven Central into {libs} (once) ...")
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-s",
        str(MAVEN_DIR / "settings.xml"),
        "-f",
        str(MAVEN_DIR / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
        f"-Dspark.kafka.version={version}",
        f"-Dspark.token.version={token_version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = (result.stdout + result.stderr).strip()
        if "Could not find artifact" in output or "Could not resolve" in output or "not found" in output:
            missing.write_text(output[-2000:])
            return None
        raise EnvironmentProblem(
            f"Maven could not fetch Spark's Kafka connector {version}:\n"
            + "\n".join("    " + line for line in output.splitlines()[-12:]),
            hint="check network access to https://repo1.maven.org",
        )
    if libs.exists():
        shutil.rmtree(libs)
    staging.rename(libs)
    (cache / ".complete").write_text(version)
    return libs


def connector_jars(say) -> ConnectorJars:
    import pyspark

    wanted = pyspark.__version__
    attempts = [(wanted, wanted), (_fallback("spark.kafka.version"), _fallback("spark.token.version"))]
    for version, token_version in dict.fromkeys(attempts):
        libs = _resolve(version, token_version, say)
        if libs is None:
            say(f"Maven Central has no spark-sql-kafka-0-10_2.13:{version} (or its dependencies); trying the fallback")
            continue
        shipped = _pyspark_jar_names()
        jars = sorted(str(p) for p in libs.glob("*.jar") if _artifact(p.name) not in shipped)
        return ConnectorJars(version, token_version, wanted, jars)
    raise EnvironmentProblem(
        f"no spark-sql-kafka-0-10_2.13 could be resolved (tried {', '.join(v for v, _ in attempts)})",
        hint="set spark.kafka.version in bench/maven/pom.xml to a version Maven Central has",
    )

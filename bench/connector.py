"""Spark's built-in Kafka connector jars, resolved from Maven Central once (eos_ops.jvm.fetch_jars,
like ops/kafka/pom.xml's), into $EOS_HOME/bench/spark-kafka/<version>-<token provider version>/.

The connector must match PySpark's version; when Maven Central has no spark-sql-kafka-0-10 of
that version (PySpark 4.3.0 here: checked on repo1.maven.org), the pom's fallback version is
used and the report says so. Only jars PySpark does not already ship are passed to spark.jars:
two copies of a class on the classpath would make the comparison about class loading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home
from eos_ops.jvm import fetch_jars

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


def _resolve(version: str, token_version: str, say) -> tuple[Path | None, str]:
    """The connector's jars (cached by version), or None and why: Maven Central may not have them."""
    return fetch_jars(
        MAVEN_DIR / "pom.xml",
        eos_home() / "bench" / "spark-kafka",
        f"spark-sql-kafka-0-10_2.13 {version}",
        say,
        properties={"spark.kafka.version": version, "spark.token.version": token_version},
        key=f"{version}-{token_version}-avro",
        settings=MAVEN_DIR / "settings.xml",
        optional=True,
    )


def connector_jars(say) -> ConnectorJars:
    import pyspark

    wanted = pyspark.__version__
    attempts = [(wanted, wanted), (_fallback("spark.kafka.version"), _fallback("spark.token.version"))]
    reasons = []
    for version, token_version in dict.fromkeys(attempts):
        libs, why = _resolve(version, token_version, say)
        if libs is None:
            say(f"no spark-sql-kafka-0-10_2.13:{version} from Maven Central (or its dependencies); trying the fallback")
            reasons.append(why)
            continue
        shipped = _pyspark_jar_names()
        jars = sorted(str(p) for p in libs.glob("*.jar") if _artifact(p.name) not in shipped)
        return ConnectorJars(version, token_version, wanted, jars)
    raise EnvironmentProblem(
        f"no spark-sql-kafka-0-10_2.13 could be resolved (tried {', '.join(v for v, _ in attempts)}):\n"
        + "\n".join(reasons),
        hint="check network access to https://repo1.maven.org; if Maven Central answered, set spark.kafka.version "
        "in bench/maven/pom.xml to a version it has",
    )

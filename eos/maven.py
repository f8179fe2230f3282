"""Jars from Maven Central, resolved once with a pom and kept in a cache keyed by the pom's hash.

For the JVM services of the operational tools (the local broker, HDFS, S3: eos_ops.jvm re-exports
this) and for the core itself: the S3A connector Spark needs for an s3a:// checkpoint (eos.s3a).
Needs Maven (`mvn`) the first time a pom is used, and the network then only.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from eos.errors import EnvironmentProblem

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def jar_cache_dir(pom: Path, cache_root: Path) -> Path:
    """Where the jars of `pom` live: a new pom (another version) never reuses an old cache."""
    return cache_root / hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def fetch_jars(pom: Path, cache_root: Path, what: str, progress: Progress = quiet) -> Path:
    """Resolve the runtime jars of `pom` from Maven Central once; returns the libs folder.

    The jars land in a staging folder renamed into place, and a `.complete` marker is written
    last, so an interrupted download is redone rather than half-used."""
    cache = jar_cache_dir(pom, cache_root)
    libs = cache / "libs"
    if (cache / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem(
            f"Maven (mvn) was not found: it is needed once, to fetch the {what} jars.",
            hint="install Maven (e.g. `apt install maven`)",
        )
    progress(f"Fetching {what} jars from Maven Central into {libs} (once) ...")
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
    cmd = [
        mvn, "-B", "-q", "-f", str(pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            cache.rmdir()  # only if empty: no cache folder for a pom that never resolved
        raise _maven_failed(what, cmd, (result.stdout + result.stderr).strip())
    if libs.exists():
        shutil.rmtree(libs)
    staging.rename(libs)
    (cache / ".complete").write_text(what)
    jars = len(list(libs.glob("*.jar")))
    progress(f"Fetched {jars} jars in {time.monotonic() - started:.1f} s.")
    return libs


def _maven_failed(what: str, cmd: list[str], output: str) -> EnvironmentProblem:
    # "could not be resolved" alone also means a wrong coordinate; only network failures say offline.
    offline = re.search(r"Could not transfer|UnknownHost|offline|Connection refused|Network is unreachable", output)
    return EnvironmentProblem(
        f"Maven could not fetch the {what} jars"
        + (" (Maven Central unreachable: are you offline?)" if offline else "")
        + f".\n  command: {' '.join(cmd)}\n  last lines:\n"
        + "\n".join("    " + line for line in output.splitlines()[-15:]),
        hint="check network access to https://repo1.maven.org, or a Maven mirror in ~/.m2/settings.xml",
    )

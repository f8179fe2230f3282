"""A real schema registry for the tests: Apicurio Registry, run from Maven Central.

Apicurio Registry publishes its Quarkus application on Maven Central as
`io.apicurio:apicurio-registry-app:<version>:tar.gz:all` (a runner jar plus its lib/ folder). The
3.0.x line runs on Java 17 (3.3.x needs Java 21) and serves a Confluent-compatible API under
`/apis/ccompat/v7`, which is what confluent-kafka's SchemaRegistryClient speaks. Like the Kafka
fixture, it is resolved once with Maven into $EOS_HOME/apicurio/<version>, started on a free
loopback port with in-memory storage, and stopped when the session ends. No stand-in is used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eos.errors import EnvironmentProblem
from eos.paths import eos_home

APICURIO_VERSION = "3.0.9"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
CCOMPAT = "/apis/ccompat/v7"


@dataclass
class RunningRegistry:
    url: str  # the Confluent-compatible base URL, as pipelines write it in `registry:`
    process: subprocess.Popen
    log: Path


def fetch_apicurio() -> Path:
    """The folder holding the runner jar, fetched with Maven once."""
    home = eos_home() / "apicurio" / APICURIO_VERSION
    runner = home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
    if (home / ".complete").exists():
        return home
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem("Maven (mvn) is needed once, to fetch Apicurio Registry for the registry tests")
    staging = Path(tempfile.mkdtemp(prefix="apicurio-", dir=eos_home()))
    try:
        cmd = [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={ARTIFACT}", f"-DoutputDirectory={staging}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise EnvironmentProblem(f"could not fetch {ARTIFACT}:\n{(result.stdout + result.stderr)[-2000:]}")
        [archive] = staging.glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(staging / "app", filter="data")
        if home.exists():
            shutil.rmtree(home)
        home.parent.mkdir(parents=True, exist_ok=True)
        (staging / "app").rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not runner.exists():
        raise EnvironmentProblem(f"{ARTIFACT} has no {runner.name}")
    (home / ".complete").write_text(APICURIO_VERSION)
    return home


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/subjects", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running_apicurio(workdir: Path, timeout_s: float = 120) -> Iterator[RunningRegistry]:
    from eos_ops.localkafka import find_java, free_port

    home = fetch_apicurio()
    port = free_port()
    log = workdir / "apicurio.log"
    cmd = [
        find_java(), "-Xmx384m", "-XX:+UseSerialGC",
        f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1",
        "-jar", str(home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}{CCOMPAT}"
    started = time.monotonic()
    try:
        while not _answers(url):
            if process.poll() is not None:
                raise EnvironmentProblem(f"Apicurio Registry exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() - started > timeout_s:
                raise EnvironmentProblem(
                    f"Apicurio Registry not ready in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        print(f"Apicurio Registry {APICURIO_VERSION} ready at {url} in {time.monotonic() - started:.1f} s")
        yield RunningRegistry(url, process, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

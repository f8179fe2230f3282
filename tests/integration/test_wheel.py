"""`pip install` of a built wheel gives a working `eos`, with no Makefile and no checkout: the wheel
is built from this checkout and installed into a fresh virtualenv outside it, and everything below
runs from there, in a folder of its own, with a fresh $EOS_HOME:

- `eos --version`; the packages import from the virtualenv, and find their data files (the poms,
  the servers' settings, the examples' schemas) inside the package, not beside it: the test puts
  a foreign top-level `ops` package and `examples`, `schemas` folders into site-packages first, as
  other distributions do (Canonical's charm framework installs an `ops` package);
- `eos init`, `eos validate`, `eos check --no-spark` against the session's broker and `eos run
  --trigger available-now` of the starter (Spark from the installed pyspark, its spark-home
  mirror and launcher under the new $EOS_HOME);
- `eos kafka fetch` without Maven says that Maven is needed;
- `eos kafka start` on a free port (the jars fetched from Maven Central into $EOS_HOME with the
  wheel's pom), `eos kafka stop`.

One test: the install is the expensive part (~900 MB written, most of it PySpark's jars; pip's
cache spares the download). `--no-compile` leaves the bytecode to the first imports.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from eos_connectors.kafka.clients import create_topic
from eos_ops.jvm import free_port_run, pid_from_file, terminate
from tests.integration.test_init import assert_starter_output, produce_events
from tests.pipelines import ROOT
from tests.spark_cds import BASE_OPTS

# Variables of this test process that would make the installed eos use the checkout's files or
# interpreter, or skip writing bytecode (every Spark Python process would compile PySpark again).
NOT_INHERITED = (
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME",
    "EOS_OPS_DIR", "PYTHONDONTWRITEBYTECODE", "SPARK_SUBMIT_OPTS", "PYSPARK_SUBMIT_ARGS",
)  # fmt: skip


def run(cmd: list[str | Path], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    output = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{output}"
    return done


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_virtualenv_works(tmp_path, bootstrap, admin, unique_name):
    try:
        check_the_installed_wheel(tmp_path, bootstrap, admin, unique_name)
    finally:  # ~1 GB: not kept in pytest's last three temporary folders
        shutil.rmtree(tmp_path / "venv", ignore_errors=True)
        shutil.rmtree(tmp_path / "eos-home", ignore_errors=True)


def check_the_installed_wheel(tmp_path: Path, bootstrap: str, admin, unique_name) -> None:
    timings: dict[str, float] = {}
    started = time.monotonic()

    def step(name: str) -> None:
        nonlocal started
        timings[name] = time.monotonic() - started
        started = time.monotonic()

    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", ROOT], timeout=300)
    (wheel,) = (tmp_path / "dist").glob("eos-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", wheel], timeout=900)
    step("build and install")

    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(run([python, "-c", purelib], timeout=60).stdout.strip())
    assert site != Path(sysconfig.get_path("purelib"))
    (site / "ops").mkdir()
    (site / "ops" / "__init__.py").write_text("# another distribution's top-level package\n")
    (site / "examples").mkdir()
    (site / "schemas").mkdir()

    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "eos-home"
    env = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
    # The tests' JVM flags without their class-data archive, which is for the checkout's pyspark.
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", EOS_HOME=str(home), BROKERS=bootstrap, SPARK_SUBMIT_OPTS=BASE_OPTS)

    def eos(*args: str, timeout: float = 120, path: str | None = None) -> subprocess.CompletedProcess:
        """The installed `eos` in a process group of its own: on a timeout, its Spark JVM goes too."""
        cmd = [str(venv / "bin" / "eos"), *args]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
            env={**env, "PATH": path} if path else env, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(cmd)} did not finish in {timeout} s:\n{(out + err)[-4000:]}") from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    version = eos("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"eos {wheel.name.split('-')[1]}", version
    where = run([python, "-c", (
        "import eos, eos_connectors, eos_ops\n"
        "from eos_connectors import kafka, postgres\n"
        "from eos.paths import ops_dir, schemas_dir, examples_dir\n"
        "for path in (eos.__file__, eos_connectors.__file__, eos_ops.__file__, ops_dir() / 'kafka' / 'pom.xml',\n"
        "             ops_dir() / 'hadoop' / 'pom.xml', ops_dir() / 'spark' / 'log4j2.properties',\n"
        "             schemas_dir() / 'ad_event.avsc', examples_dir() / 'ad_attribution.yaml'):\n"
        "    print(path)\n"
    )], timeout=120, cwd=work, env=env).stdout.split()  # fmt: skip
    for path in where:
        assert Path(path).is_file() and Path(path).is_relative_to(site), where
    assert all(Path(path).is_relative_to(site / "eos") for path in where[3:]), where
    step("version and imports")

    name = unique_name("wheel")
    topic, output = f"{name}-in", f"{name}-out"
    init = eos("init", "pipeline.yaml", "--name", name, "--input", topic, "--output", output)
    assert init.returncode == 0, init.stderr
    validated = eos("validate", "pipeline.yaml")
    assert validated.returncode == 0 and "pipeline.yaml: valid" in validated.stdout, validated.stdout + validated.stderr
    assert create_topic(admin, topic, 2)
    produce_events(bootstrap, topic)
    checked = eos("check", "--no-spark", "pipeline.yaml")
    assert checked.returncode == 0 and "ready to run" in checked.stdout, checked.stdout + checked.stderr
    step("init, validate, check")
    ran = eos("run", "pipeline.yaml", "--trigger", "available-now", timeout=600)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
    assert_starter_output(bootstrap, output, f"{topic}-dlq")
    assert list((home / "spark-home").iterdir()) and list((home / "spark-python").iterdir())
    step("run")

    # Without Maven, the first use of the local broker says what is missing.
    no_maven = eos("kafka", "fetch", path=str(venv / "bin"))
    assert no_maven.returncode == 1, no_maven
    assert "Maven (mvn) was not found" in no_maven.stderr and "Traceback" not in no_maven.stderr, no_maven.stderr
    port = free_port_run(2)
    try:
        started_kafka = eos("kafka", "start", "--port", str(port), timeout=600)
        assert started_kafka.returncode == 0, (started_kafka.stdout + started_kafka.stderr)[-4000:]
        assert "Fetching Apache Kafka" in started_kafka.stderr, started_kafka.stderr
        assert len(list(home.glob("kafka/*/libs/kafka-server-[0-9]*.jar"))) == 1
        stopped = eos("kafka", "stop", "--port", str(port))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    finally:
        pid = pid_from_file(home / f"broker-{port}" / "broker.pid", "kafka.Kafka", str(home / f"broker-{port}"))
        if pid is not None:
            terminate(pid, timeout=30, kill=True)
    step("kafka start and stop")
    print("wheel test steps (s):", {key: round(value, 1) for key, value in timings.items()})

"""Test-only: the JVM options of every Spark driver the tests start, with a class-data archive.

The tests start well over a hundred Spark driver JVMs (each `eos run` subprocess of the fault
tests is one), and a cold driver spends seconds loading and verifying Spark's classes. A
class-data-sharing archive (JDK 13+ `-XX:ArchiveClassesAtExit`, AppCDS) holds those classes
pre-parsed: built once per $EOS_HOME by a small Spark job, then mapped by every later driver.
Measured on this 2-core machine under load, alternating: a cold session plus two small jobs
18.1 and 24.2 s without, 10.4 and 16.4 s with it.

The JVM checks the archive against its own build and class path and ignores an archive that does
not match (a driver with extra jars on its class path, another JDK): that driver only starts as
it would without one (`-Xlog:cds=off` keeps the JVM's note about it out of the output the tests
read). Not a product default: an archive is tied to one JDK and one Spark installation.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

# The C1 compiler alone and the serial collector: short jobs, where start-up and JIT compilation
# dominate (a cold session plus two small jobs from 25-30 s to 12 s on this machine under load).
BASE_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_WARM_UP = """
from eos.sparksession import build_spark
spark = build_spark("eos-tests-cds", master="local[2]")
spark.range(1000).selectExpr("sum(id)").collect()
frame = spark.createDataFrame([(1, "a")], "x int, y string")
frame.mapInArrow(lambda batches: batches, frame.schema).collect()
query = spark.readStream.format("rate").load().writeStream.format("noop").trigger(once=True).start()
query.awaitTermination(120)
spark.stop()
"""


def archive_path() -> Path:
    import pyspark

    from eos.paths import eos_home

    # "mirror": drivers run from eos's SPARK_HOME mirror (eos.sparksession.compiled_spark_home),
    # so their class path differs from an archive built before it existed.
    key = f"{pyspark.__version__}|{Path(pyspark.__file__).resolve().parent}|{os.environ.get('JAVA_HOME', '')}|mirror"
    return eos_home() / "test-cds" / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def driver_opts() -> str:
    """SPARK_SUBMIT_OPTS for the tests' drivers; builds the archive first when it is missing."""
    archive = archive_path()
    if not archive.exists():
        _build(archive)
    if not archive.exists():
        return BASE_OPTS
    return f"{BASE_OPTS} -XX:SharedArchiveFile={archive} -Xlog:cds=off,cds+dynamic=off"


def _build(archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{BASE_OPTS} -XX:ArchiveClassesAtExit={partial}"}
    started = time.monotonic()
    print(f"tests: building a class-data archive for Spark drivers at {archive} ...", file=sys.stderr, flush=True)
    try:
        done = subprocess.run([sys.executable, "-c", _WARM_UP], env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0 or not partial.exists():
        # Only slower: every driver then starts without an archive.
        tail = "timed out" if done is None else (done.stderr or done.stdout)[-1500:]
        print(f"tests: no class-data archive (drivers start without one): {tail}", file=sys.stderr, flush=True)
        partial.unlink(missing_ok=True)
        return
    partial.replace(archive)
    print(f"tests: class-data archive built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

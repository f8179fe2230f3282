"""Test support for the Delta sink: readers that share no code with eos.

- `delta_ids`: delta-rs's own reader (`deltalake`), through eos_ops.delta.read_table, which is
  nothing but `DeltaTable(uri).to_pyarrow_table()`.
- `SparkDeltaReader`: Spark's own Delta reader (delta-spark), in a process of its own. No
  delta-spark build runs on PySpark 4.3.0, which eos uses (tests/delta_spark/pom.xml lists the
  builds tried and how they fail), so it runs on PySpark 4.2.0, the Spark its build is made for,
  in a virtualenv under $EOS_HOME made once (pip's cache makes later ones quick); its jars come
  from Maven Central like the broker's. One such process serves a whole test session. It also has
  the S3A connector eos adds for s3a:// checkpoints (eos.s3a: hadoop-aws 3.5.0, which is the Hadoop
  client PySpark 4.2.0 bundles too), so it reads a table on S3 as `s3a://bucket/path` with the
  Hadoop settings a request carries (`read(..., hadoop=...)`, sent on stdin).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eos import s3a
from eos.paths import eos_home
from eos_ops import jvm
from eos_ops.delta import read_table

HERE = Path(__file__).resolve().parent / "delta_spark"
PYSPARK = "pyspark==4.2.0"


def delta_ids(uri: str | Path, column: str = "id") -> Counter[str]:
    """The table's ids as delta-rs reads its latest version."""
    return Counter(str(row[column]) for row in read_table(uri))


def spark42_python() -> Path:
    """A virtualenv with PySpark 4.2 (and nothing of eos), made once; its python. (The benchmark's
    Delta section runs Spark's own Delta write there too: bench/sections/delta.py.)"""
    venv = eos_home() / "delta-spark-reader" / "venv"
    marker = venv / f".{PYSPARK}"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", PYSPARK], check=True)
        marker.touch()
    return venv / "bin" / "python"


class SparkDeltaReader:
    def __init__(self) -> None:
        libs = jvm.fetch_jars(HERE / "pom.xml", eos_home() / "delta-spark", "delta-spark (tests)", print)
        jars = [*(str(j) for j in sorted(libs.glob("*.jar"))), *s3a.connector_jars(print)]
        python = spark42_python()
        hadoop = f"hadoop-client-api-{s3a.hadoop_aws_version()}.jar"  # hadoop-aws fits this Hadoop only
        assert list(python.parent.parent.glob(f"lib/python*/site-packages/pyspark/jars/{hadoop}")), (
            f"{PYSPARK} in {python} does not bundle {hadoop}: the S3A connector would not fit it"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_", "PYTHON"))}
        self.process = subprocess.Popen(
            [str(python), str(HERE / "reader.py"), ",".join(jars)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        ready = self._answer(600)
        assert "ready" in ready, ready

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.process.stdout], [], [], 1.0)
            if readable:
                line = self.process.stdout.readline()
                if not line:
                    raise AssertionError(f"the Spark Delta reader exited ({self.process.poll()})")
                if line.startswith("{"):
                    return json.loads(line)
        raise AssertionError(f"the Spark Delta reader did not answer in {timeout_s:.0f} s")

    def read(
        self, uri: str | Path, columns: list[str] | None = None, hadoop: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The table's rows; `hadoop`: settings for its filesystem (s3a:// endpoint, credentials)."""
        assert self.process.stdin is not None
        request = {"path": str(uri), "columns": columns or [], "hadoop": hadoop or {}}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer(600)
        assert "rows" in answer, answer.get("error")
        return answer["rows"]

    def ids(self, uri: str | Path, column: str = "id", hadoop: dict[str, str] | None = None) -> Counter[str]:
        return Counter(str(row[column]) for row in self.read(uri, [column], hadoop))

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_reader: SparkDeltaReader | None = None


def spark_delta_reader() -> SparkDeltaReader:
    """The session's one Spark Delta reader (closed when the tests end)."""
    global _reader
    if _reader is None:
        _reader = SparkDeltaReader()
        atexit.register(_reader.close)
    return _reader

"""A real HDFS for tests: NameNode + DataNode JVMs from the Hadoop jars, under a test folder.

Kept apart from tests/support.py so tests that only need Kafka never import the HDFS code.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from eos_ops.hdfs import ROLES, LocalHdfs

# A daemon that hits a class the trimmed jar set (ops/hadoop/pom.xml) left out logs one of these.
MISSING_CLASS = re.compile(r"NoClassDefFoundError|ClassNotFoundException")


def _progress(message: str) -> None:
    print(f"[hdfs] {message}", file=sys.stderr, flush=True)


def start_hdfs_under_test(workdir: Path) -> tuple[str, LocalHdfs, Callable[[], None]]:
    """Start a fresh HDFS in `workdir`; returns (hdfs://127.0.0.1:PORT, the LocalHdfs, close).

    close() stops both daemons (SIGKILL after 60 s) and is safe to call twice."""
    hdfs = LocalHdfs(workdir / "hdfs")
    try:
        hdfs.start(progress=_progress)
    except BaseException:
        hdfs.stop(kill=True)
        raise

    def close() -> None:
        hdfs.stop(progress=_progress)

    return hdfs.url, hdfs, close


def missing_classes(hdfs: LocalHdfs) -> list[str]:
    """Log lines where a daemon failed to load a class: the jar set is missing something."""
    lines = []
    for role in ROLES:
        log = hdfs.log_file(role)
        if log.exists():
            lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()]
    return [line for line in lines if MISSING_CLASS.search(line)]

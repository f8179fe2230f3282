"""A real S3 server for tests: S3Proxy (eos_ops.s3) on loopback, under a test folder, one per session.

Kept apart from tests/support.py so tests that only need Kafka never import the S3 code. Tests
share the session's server and its bucket and keep apart by key prefix (`prefix()`); the Delta
sink's tests take the endpoint and credentials from `env` (the AWS_* names delta-rs reads).
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from eos_ops.s3 import REGION, LocalS3, S3Client

# The server hit a class the trimmed jar set (ops/s3/s3proxy/pom.xml) left out.
MISSING_CLASS = re.compile(r"NoClassDefFoundError|ClassNotFoundException")
# Names the tests' pipelines take the credentials from, with ${VAR}: not the AWS_* names, which
# S3A's default credential chain would also read from the environment behind spark.conf's back.
ACCESS_VAR, SECRET_VAR = "EOS_TEST_S3_ACCESS_KEY", "EOS_TEST_S3_SECRET_KEY"


def _progress(message: str) -> None:
    print(f"[s3] {message}", file=sys.stderr, flush=True)


@dataclass
class S3UnderTest:
    server: LocalS3
    start_seconds: float  # the fixture's start, jars fetched or not

    @property
    def bucket(self) -> str:
        return self.server.bucket

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def secret_key(self) -> str:
        return self.server.credentials().secret_key

    @property
    def env(self) -> dict[str, str]:
        """AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP."""
        return self.server.env()

    def client(self) -> S3Client:
        return self.server.client()

    def prefix(self, name: str) -> str:
        """A key prefix no other test uses."""
        return f"{re.sub(r'[^A-Za-z0-9-]+', '-', name)[:40]}-{uuid.uuid4().hex[:8]}"

    def spark_conf(self) -> dict[str, str]:
        """A pipeline's `spark.conf` for this server, credentials as ${ACCESS_VAR} and ${SECRET_VAR}."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": REGION,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.access.key": f"${{{ACCESS_VAR}}}",
            "spark.hadoop.fs.s3a.secret.key": f"${{{SECRET_VAR}}}",
        }

    def credentials_env(self) -> dict[str, str]:
        """The environment an `eos` process needs for spark_conf()'s ${VAR}s."""
        credentials = self.server.credentials()
        return {ACCESS_VAR: credentials.access_key, SECRET_VAR: credentials.secret_key}

    def missing_classes(self) -> list[str]:
        log = self.server.log_file
        text = log.read_text(errors="replace") if log.exists() else ""
        return [line for line in text.splitlines() if MISSING_CLASS.search(line)]

    def close(self) -> None:
        self.server.stop(progress=_progress)


def start_s3_under_test(workdir: Path) -> S3UnderTest:
    """Start a fresh server in `workdir` (jars fetched on first use); stop it with close()."""
    started = time.monotonic()
    server = LocalS3(workdir / "s3")
    try:
        server.start(progress=_progress)
    except BaseException:
        server.stop(kill=True)
        raise
    return S3UnderTest(server, time.monotonic() - started)

"""Shared fixtures: a real Kafka broker, unique topics, a real local SparkSession.

The broker, in order of choice:
  1. EOS_KAFKA_BOOTSTRAP, if set: an existing cluster;
  2. a testcontainers Kafka container, when a Docker engine answers;
  3. the embedded local broker (`eos kafka start`), on a free port in a temporary folder.
Tests never mock Kafka and never skip because no broker is around: they start one.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from eos_connectors.kafka.clients import admin_client, create_topic
from tests.spark_cds import driver_opts
from tests.support import KafkaUnderTest, start_kafka_under_test
from tests.support_secure import SecureKafka, start_secure_kafka

# Test-only: every Spark driver the tests start (in this process, in `eos` subprocesses, under
# spark-submit) runs short jobs, where JVM start-up dominates. Spark's launcher adds
# SPARK_SUBMIT_OPTS to the driver JVM: C1 only, the serial collector, and a class-data archive of
# Spark's classes built once per $EOS_HOME (tests/spark_cds.py). Not a product default.
if "SPARK_SUBMIT_OPTS" not in os.environ:
    os.environ["SPARK_SUBMIT_OPTS"] = driver_opts()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaUnderTest]:
    under_test = start_kafka_under_test(tmp_path_factory.mktemp("kafka"))
    try:
        yield under_test
    finally:
        under_test.close()


@pytest.fixture(scope="session")
def bootstrap(kafka: KafkaUnderTest) -> str:
    return kafka.bootstrap


@pytest.fixture(scope="session")
def admin(bootstrap: str):
    return admin_client({"bootstrap.servers": bootstrap})


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[SecureKafka]:
    """ONE secured local broker for the whole session (SASL_SSL, SCRAM-SHA-512, the StandardAuthorizer,
    no access without an ACL): `bootstrap`, `settings(user)` (librdkafka settings of a SCRAM user made
    on first use), `admin` (the super user's AdminClient, for set-up), `grant_all(user)`, `revoke(acls)`.
    Always the embedded broker, whatever EOS_KAFKA_BOOTSTRAP says: the tests need its super user."""
    secured = start_secure_kafka(tmp_path_factory.mktemp("secure-kafka"))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown in every run, not only with -s
        print(f"\nsecured Kafka broker (SASL_SSL) started in {secured.start_seconds:.1f} s", flush=True)
    try:
        yield secured
    finally:
        secured.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Names unique per test (and per call), so tests sharing a broker never interfere."""
    test = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:40].strip("-")

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def new_topic(admin, unique_name) -> Callable[..., str]:
    """Create a fresh topic: new_topic(partitions=1, prefix='t', config=None) -> name."""

    def make(partitions: int = 1, prefix: str = "t", config: dict[str, str] | None = None) -> str:
        name = unique_name(prefix)
        assert create_topic(admin, name, partitions, config=config), f"topic {name} already existed"
        return name

    return make


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server (max_prepared_transactions > 0), started once per session; its DSN."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.support_postgres import start_postgres_under_test

    # Not under pytest's basetemp: started as root, the server runs as an unprivileged account
    # that needs search permission on every folder above its data, and every new pytest session
    # on the machine resets /tmp/pytest-of-<user> to 0700 (a second pytest run took the data
    # folder away from a running server: "could not open file .../global/pg_control").
    folder = Path(tempfile.mkdtemp(prefix="eos-test-postgres-"))
    dsn, close = start_postgres_under_test(folder)
    try:
        yield dsn
    finally:
        close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def spark():
    from eos.sparksession import build_spark

    session = build_spark(
        "eos-tests",
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


def pytest_report_header(config: pytest.Config) -> str:
    source = os.environ.get("EOS_KAFKA_BOOTSTRAP") or "testcontainers if Docker answers, else the local broker"
    return f"eos: Kafka under test: {source}"

"""Fixtures of the cluster tests: a real 3-node Kafka KRaft cluster (RF 3, min ISR 2), started once
for every test under tests/cluster and stopped at the end of the session. These tests run last
(pyproject's testpaths), so the cluster never idles through the cheaper tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from eos_connectors.kafka.clients import admin_client, create_topic
from tests.support import ClusterUnderTest, start_kafka_cluster_under_test, wait_for_topic


@pytest.fixture(scope="session")
def cluster_under_test(tmp_path_factory: pytest.TempPathFactory, request) -> Iterator[ClusterUnderTest]:
    under_test = start_kafka_cluster_under_test(tmp_path_factory.mktemp("kafka-cluster"))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown in every run, not only with -s
        print(f"\n3-node Kafka cluster started in {under_test.start_seconds:.1f} s", flush=True)
    try:
        yield under_test
    finally:
        under_test.close()


@pytest.fixture
def cluster(cluster_under_test: ClusterUnderTest):
    """The LocalCluster, whole before the test and made whole again after it (resume, restart, resync)."""
    cluster = cluster_under_test.cluster
    cluster.wait_until_healthy(timeout=120)
    try:
        yield cluster
    finally:
        cluster.start(timeout=180)


@pytest.fixture
def bootstrap(cluster_under_test: ClusterUnderTest) -> str:
    return cluster_under_test.bootstrap


@pytest.fixture
def admin(bootstrap: str):
    return admin_client({"bootstrap.servers": bootstrap})


@pytest.fixture
def new_topic(admin, unique_name) -> Callable[..., str]:
    def make(partitions: int = 3, replication: int = -1) -> str:
        name = unique_name("t")
        assert create_topic(admin, name, partitions, replication), f"topic {name} already existed"
        wait_for_topic(admin, name, partitions)
        return name

    return make


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory: pytest.TempPathFactory):
    """A real HDFS (NameNode + DataNode JVMs from Hadoop's jars on Maven Central), once a session."""
    from tests.support_hdfs import start_hdfs_under_test

    _, local, close = start_hdfs_under_test(tmp_path_factory.mktemp("hdfs"))
    try:
        yield local
    finally:
        close()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A real Spark standalone cluster: a master and two one-core workers from the PySpark wheel."""
    from tests.support_spark_cluster import start_spark_cluster_under_test

    cluster = start_spark_cluster_under_test(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()

"""Fixtures of the cluster tests: a real 3-node Kafka KRaft cluster (RF 3, min ISR 2), started once
for every test under tests/cluster and stopped at the end of the session. These tests run last
(pyproject's testpaths), so the cluster never idles through the cheaper tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import ClusterUnderTest, start_kafka_cluster_under_test


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

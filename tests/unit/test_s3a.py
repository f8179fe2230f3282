"""What eos adds to a Spark it starts for an s3a:// checkpoint (eos.s3a): the S3A connector, at the
version of PySpark's Hadoop client, only when nothing else brings it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eos import s3a
from eos.errors import EnvironmentProblem

ROOT = Path(__file__).resolve().parents[2]
JARS = ["/cache/libs/hadoop-aws-3.5.0.jar", "/cache/libs/s3-2.35.4.jar"]


def test_hadoop_aws_is_the_hadoop_version_pyspark_bundles_and_the_local_hdfs_runs():
    hdfs_pom = (ROOT / "ops" / "hadoop" / "pom.xml").read_text()
    hdfs = re.search(r"<hadoop.version>([^<]+)</hadoop.version>", hdfs_pom)
    assert s3a.bundled_hadoop_version() == s3a.hadoop_aws_version() == (hdfs and hdfs.group(1))


def test_the_aws_sdk_bundle_stays_out():
    pom = s3a.pom().read_text()
    assert re.search(r"<artifactId>bundle</artifactId></exclusion>", pom), "the whole SDK would come"


@pytest.fixture
def fetched(monkeypatch):
    """connector_jars without Maven: the jar list a fetch returns (the merge below is pure logic)."""
    calls = []

    def jars(progress):
        calls.append(progress)
        return list(JARS)

    monkeypatch.setattr(s3a, "connector_jars", jars)
    return calls


def test_an_s3a_checkpoint_gets_the_connector_after_the_pipelines_own_jars(fetched):
    assert s3a.with_connector({"a": "1"}, "s3a://bucket/ck")["spark.jars"] == ",".join(JARS)
    mine = s3a.with_connector({"spark.jars": "/opt/udfs.jar"}, "s3a://bucket/ck")["spark.jars"]
    assert mine == ",".join(["/opt/udfs.jar", *JARS])
    assert len(fetched) == 2


@pytest.mark.parametrize("checkpoint", [None, "/tmp/ck", "file:///tmp/ck", "hdfs://nn:8020/ck", "s3://bucket/ck"])
def test_other_checkpoints_get_nothing(fetched, checkpoint):
    assert s3a.with_connector({"a": "1"}, checkpoint) == {"a": "1"}
    assert fetched == []


@pytest.mark.parametrize(
    "settings",
    [
        {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.5.0"},
        {"spark.jars": "/opt/jars/hadoop-aws-3.5.0.jar,/opt/jars/bundle-2.35.4.jar"},
        {"spark.driver.extraClassPath": "/opt/hadoop/share/hadoop/tools/lib/hadoop-aws-3.5.0.jar"},
    ],
)
def test_a_connector_the_pipeline_brings_is_left_alone(fetched, settings):
    assert s3a.with_connector(settings, "s3a://bucket/ck") == settings
    assert fetched == []


def test_a_connector_of_another_hadoop_version_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(s3a, "bundled_hadoop_version", lambda: "3.9.9")
    with pytest.raises(EnvironmentProblem, match=r"PySpark bundles Hadoop 3\.9\.9.*hadoop-aws 3\.5\.0"):
        s3a.connector_jars(lambda _: None)

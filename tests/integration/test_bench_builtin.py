"""The benchmark's Spark built-in baseline (bench/builtin.py) decodes every record once.

With the decode as a deterministic UDF, Spark's optimizer pushed the filters on its result (the
poison check, the SQL's WHERE) below the projection and evaluated the UDF twice per record, once
for the filter and once for the columns: the baseline paid a second Avro decode that a tuned
PySpark pipeline would not, and eos's ratios against it looked better than they are. This test
reads the physical plan of the stateless benchmark pipeline's source side (batch rows shaped like
Spark's Kafka source, so no broker is needed) and counts the decode UDF's evaluations.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.builtin import decoded_rows
from bench.pipelines import STATELESS_SQL, stateless_config
from eos.api import ERROR, POISON_COLUMNS
from eos.config import pipeline_from_yaml
from eos.yamlsource import parse_yaml
from eos_connectors.formats.decode import source_view

KAFKA_ROWS = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)


def test_the_builtin_baseline_decodes_each_record_once(spark, tmp_path: Path) -> None:
    settings = stateless_config(
        name="plan", bootstrap="127.0.0.1:9", topic="in", out_topic="out", checkpoint=tmp_path / "cp",
        mode="at-least-once", epoch_records=None,
    )  # fmt: skip
    config = pipeline_from_yaml(parse_yaml(yaml.safe_dump(settings, sort_keys=False), "<plan>"))
    source = config.sources[0]
    session = spark.newSession()
    decoded = decoded_rows(session.createDataFrame([], KAFKA_ROWS), source, tmp_path)
    view = source_view(decoded, source).filter(f"{ERROR} IS NULL").drop(*POISON_COLUMNS)
    view.createOrReplaceTempView(source.name)
    rows = session.sql(STATELESS_SQL)
    plan = rows._jdf.queryExecution().executedPlan().toString()
    assert "WHERE" in STATELESS_SQL.upper()  # the filter that used to be pushed below the decode
    assert plan.count("decode_avro(") == 1, plan
    assert rows.collect() == []

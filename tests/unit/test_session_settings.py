"""The SparkSession's settings: eos's defaults, the pipeline's `spark.conf` over them, and a small
status store while the UI is off."""

from __future__ import annotations

from eos.sparksession import WITHOUT_UI, session_settings


def test_with_the_ui_off_the_status_store_keeps_little() -> None:
    settings = session_settings("local[2]", {"spark.sql.shuffle.partitions": "2"}, None, False)
    assert settings["spark.ui.enabled"] == "false"
    assert all(settings[key] == value for key, value in WITHOUT_UI.items())
    assert settings["spark.sql.shuffle.partitions"] == "2"


def test_a_pipeline_that_turns_the_ui_on_keeps_sparks_retention() -> None:
    settings = session_settings("local[2]", {"spark.ui.enabled": "true"}, None, False)
    assert not set(WITHOUT_UI) & set(settings)


def test_a_pipelines_own_retention_wins() -> None:
    settings = session_settings("local[2]", {"spark.sql.ui.retainedExecutions": "500"}, None, False)
    assert settings["spark.sql.ui.retainedExecutions"] == "500"
    assert settings["spark.ui.retainedJobs"] == WITHOUT_UI["spark.ui.retainedJobs"]


def test_under_spark_submit_the_master_is_left_to_it() -> None:
    assert "spark.master" not in session_settings(None, {}, None, True)
    assert session_settings(None, {}, None, False)["spark.master"] == "local[*]"


def test_state_stays_in_sparks_default_store_unless_the_pipeline_names_one() -> None:
    """Spark's default store keeps operator state in memory; RocksDB is the pipeline's choice, and
    gets eos's RocksDB settings (changelog checkpointing, no row count)."""
    key = "spark.sql.streaming.stateStore.providerClass"
    assert key not in session_settings("local[2]", {}, None, False)
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    chosen = session_settings("local[2]", {key: rocksdb}, None, False)
    assert chosen[key] == rocksdb
    assert chosen["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert chosen["spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"] == "false"

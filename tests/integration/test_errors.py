"""Clear errors for bad configuration and environment: each runs the real `eos` command and
asserts on what the message says, the exit code, and that nothing was (half-)committed."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.pipelines import (
    all_values,
    committed_values,
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    run_in_process,
    write_pipeline,
)

CONFIG_ERROR = 2  # eos.errors.ConfigError.exit_code: the file is wrong
ENVIRONMENT = 1  # EnvironmentProblem: a broker, topic, database is missing or unreachable
REFUSED = 3  # CheckpointError: refused to keep exactly-once


def last_error(output: str) -> str:
    """eos's own message: from the last line starting with 'error:' to the end."""
    lines = output.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert starts, output[-3000:]
    return "\n".join(lines[starts[-1] :])


def assert_nothing_written(bootstrap: str, topic: str, before: dict | None = None) -> None:
    """No committed output beyond `before`, and no open or aborted transaction's records either."""
    committed = committed_values(bootstrap, topic)
    assert committed == (before or {}), committed
    assert all_values(bootstrap, topic) == committed


# ---------------------------------------------------------------------------------------------
# The pipeline file
# ---------------------------------------------------------------------------------------------


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: p\ncheckpoint: ck\nsources:\n  - name: events\n    kafka: {bootstrap: x:1, topics: [a]\n")
    finished = eos_subprocess("validate", str(path))
    assert finished.returncode == CONFIG_ERROR
    message = last_error(finished.output)
    assert f"error: {path}:6:1: invalid YAML:" in message, message
    assert "Traceback" not in finished.output


def test_unknown_field_is_named_with_its_line_and_a_suggestion(tmp_path):
    config = passthrough_pipeline("p", "127.0.0.1:1", "a", "b", tmp_path / "ck")
    config["sources"][0]["value_formt"] = config["sources"][0].pop("value_format")
    config["epochs"]["slotz"] = 2
    path = write_pipeline(tmp_path, config)
    finished = eos_subprocess("validate", str(path))
    assert finished.returncode == CONFIG_ERROR
    message = last_error(finished.output)
    assert "2 problems" in message
    lines = path.read_text().splitlines()
    value_line = next(i for i, line in enumerate(lines, 1) if "value_formt" in line)
    assert f"{path}:{value_line}: unknown field 'sources.0.value_formt'; did you mean 'value_format'" in message
    assert "unknown field 'epochs.slotz'; did you mean 'slots'?" in message


def test_format_options_that_do_not_fit_are_refused(tmp_path):
    config = passthrough_pipeline("p", "127.0.0.1:1", "a", "b", tmp_path / "ck")
    config["sources"][0]["value_format"] = {"type": "avro"}
    config["sinks"][0]["value_format"] = {"type": "json", "registry": "http://r:8081"}
    finished = eos_subprocess("validate", str(write_pipeline(tmp_path, config)))
    assert finished.returncode == CONFIG_ERROR
    message = last_error(finished.output)
    assert "sources.0.value_format: format avro needs `schema:` (an .avsc file) or `registry:`" in message
    assert "sinks.0.value_format: format json takes `schema:` only" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "source events: value_format: schema file 'event.avsc' not found (looked in "),
        ('{"type": "record",', "source events: value_format: schema file {path} is not valid JSON: line 1"),
        (
            json.dumps({"type": "record", "name": "E", "fields": [{"name": "a", "type": "lnog"}]}),
            "source events: value_format: schema file {path} is not a valid Avro schema: ",
        ),
    ],
    ids=["missing", "not-json", "not-avro"],
)
def test_schema_file_missing_or_invalid(bootstrap, new_topic, tmp_path, content, expected):
    source, sink = new_topic(), new_topic()
    config = passthrough_pipeline("p-schema", bootstrap, source, sink, tmp_path / "ck")
    config["sources"][0]["value_format"] = {"type": "avro", "schema": "event.avsc"}
    config["sinks"][0]["value"] = "name"
    if content is not None:
        (tmp_path / "event.avsc").write_text(content)
    finished = eos_subprocess("run", str(write_pipeline(tmp_path, config)))
    assert finished.returncode == CONFIG_ERROR
    message = last_error(finished.output)
    assert expected.format(path=tmp_path / "event.avsc") in message, message
    assert not (tmp_path / "ck" / "_eos" / "pipeline.json").exists()
    assert_nothing_written(bootstrap, sink)


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------


def test_missing_source_topic(bootstrap, new_topic, unique_name, tmp_path):
    sink, missing = new_topic(), unique_name("absent")
    config = passthrough_pipeline("p-missing", bootstrap, missing, sink, tmp_path / "ck")
    path = write_pipeline(tmp_path, config)
    finished = eos_subprocess("run", str(path))
    # A missing topic is the environment's (README, exit codes): creating it fixes the run.
    assert finished.returncode == ENVIRONMENT
    message = last_error(finished.output)
    assert f"error: {path}:9: source events: topic {missing!r} does not exist on {bootstrap}" in message, message
    assert not (tmp_path / "ck" / "_eos" / "pipeline.json").exists()
    assert_nothing_written(bootstrap, sink)


def test_missing_sink_topic(bootstrap, new_topic, unique_name, tmp_path):
    source, missing = new_topic(), unique_name("absent")
    produce_numbered(bootstrap, source, 0, 10)
    # SQL that cannot be planned either: the checks run before the plan is built, so what they
    # find is the error reported.
    sql = "SELECT nope FROM events"
    config = passthrough_pipeline("p-missing-sink", bootstrap, source, missing, tmp_path / "ck", sql=sql)
    path = write_pipeline(tmp_path, config)
    finished = eos_subprocess("run", str(path))
    assert finished.returncode == ENVIRONMENT
    message = last_error(finished.output)
    assert f"error: {path}:18: sink out: topic {missing!r} does not exist on {bootstrap}" in message, message
    assert "nope" not in message
    assert "set `create_topic: true`" in message
    assert not (tmp_path / "ck" / "_eos" / "pipeline.json").exists()


def test_unreachable_broker_bounded_retries_then_a_clear_message(tmp_path):
    config = passthrough_pipeline("p-unreachable", "127.0.0.1:1", "a", "b", tmp_path / "ck")
    env = {"EOS_STARTUP_ATTEMPTS": "2", "EOS_STARTUP_RETRY_WAIT_S": "1"}
    path = write_pipeline(tmp_path, config)
    finished = eos_subprocess("run", str(path), env=env, timeout=180)
    assert finished.returncode == ENVIRONMENT
    message = last_error(finished.output)
    assert f"error: {path}:9: source events: cannot reach Kafka at 127.0.0.1:1 after 2 attempts" in message, message
    assert "hint: is the broker running (`eos kafka status`) and is bootstrap right?" in message
    assert "unreachable (attempt 1/2), retrying" in finished.output
    assert not (tmp_path / "ck" / "_eos" / "pipeline.json").exists()


# ---------------------------------------------------------------------------------------------
# The checkpoint: refuse to start, never silently reset
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def used_checkpoint(spark, bootstrap, new_topic, unique_name, tmp_path):
    """A real checkpoint: pipeline A ran over 300 records (2 slots); returns what the tests need."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 300)
    name = unique_name("a")
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck", max_records_per_epoch=100)
    run_in_process(spark, write_pipeline(tmp_path / "a", config))
    produce_numbered(bootstrap, source, 300, 50)  # new input a wrongly started run would process
    before = committed_values(bootstrap, sink)
    assert sorted(before) == sorted(sent)
    return {"config": config, "sink": sink, "before": before, "checkpoint": tmp_path / "ck", "tmp": tmp_path}


def rerun(used: dict, folder: str, **changes) -> str:
    config = {**used["config"], **changes}
    finished = eos_subprocess("run", str(write_pipeline(used["tmp"] / folder, config)))
    assert finished.returncode == REFUSED, finished.output[-3000:]
    print(last_error(finished.output))  # shown with -rP
    return last_error(finished.output)


def test_checkpoint_of_another_pipeline_is_refused(bootstrap, used_checkpoint):
    owner = used_checkpoint["config"]["name"]
    message = rerun(used_checkpoint, "b", name="b-intruder")
    assert f"belongs to pipeline {owner!r}, not 'b-intruder'; refusing to start" in message
    assert_nothing_written(bootstrap, used_checkpoint["sink"], used_checkpoint["before"])
    # Refused before recovery: the intruder never even created its ledger.
    assert not _topic_exists(bootstrap, "eos-ledger-b-intruder")


def test_corrupt_checkpoint_metadata_is_refused(bootstrap, used_checkpoint):
    meta = used_checkpoint["checkpoint"] / "_eos" / "pipeline.json"
    meta.write_text(meta.read_text()[:40])
    message = rerun(used_checkpoint, "a2")
    assert f"{meta} is corrupt" in message and "refusing to start" in message
    assert_nothing_written(bootstrap, used_checkpoint["sink"], used_checkpoint["before"])


def test_spark_checkpoint_without_eos_metadata_is_refused(bootstrap, used_checkpoint):
    shutil.rmtree(used_checkpoint["checkpoint"] / "_eos")
    message = rerun(used_checkpoint, "a3")
    assert "holds a Spark checkpoint but no eos metadata" in message and "never silently resets" in message
    assert_nothing_written(bootstrap, used_checkpoint["sink"], used_checkpoint["before"])


def test_corrupt_spark_offset_log_is_refused(bootstrap, used_checkpoint):
    offsets = used_checkpoint["checkpoint"] / "offsets"
    last = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    last.write_text("v1\n{not json")
    message = rerun(used_checkpoint, "a4")
    assert f"Spark's offset log {last} is corrupt" in message and "refusing to start" in message, message
    assert_nothing_written(bootstrap, used_checkpoint["sink"], used_checkpoint["before"])


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from eos_connectors.kafka.clients import admin_client

    return topic in admin_client({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics


def test_a_transaction_timeout_above_the_brokers_maximum_is_refused_up_front(
    bootstrap, new_topic, unique_name, tmp_path
):
    """epochs.timeout 10 minutes: transactions would need 20 minutes, the broker allows 15."""
    source, sink = new_topic(), new_topic()
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck", timeout="10m")
    finished = eos_subprocess("run", str(write_pipeline(tmp_path, config)))
    assert finished.returncode == 2, finished.output[-3000:]
    message = last_error(finished.output)
    assert "transaction.timeout.ms=1200000" in message and "transaction.max.timeout.ms=900000" in message, message
    assert "lower epochs.timeout to 450s or less" in finished.output


def test_a_ledger_topic_that_is_not_compacted_is_refused_before_anything_starts(
    spark, admin, bootstrap, new_topic, unique_name, tmp_path
):
    """Retention would delete ledger entries, and a replay after that would write committed epochs
    again. The ledger topic is made beside the query's build (KafkaSink.set_up); its problems must
    still stop the start before any record is written or the checkpoint is recorded."""
    from eos.errors import ConfigError
    from eos_connectors.kafka.clients import create_topic

    source, sink = new_topic(), new_topic()
    produce_numbered(bootstrap, source, 0, 20)
    name = unique_name("p")
    create_topic(admin, f"eos-ledger-{name}", 1, config={"cleanup.policy": "delete"})
    config = passthrough_pipeline(name, bootstrap, source, sink, tmp_path / "ck")
    with pytest.raises(ConfigError, match=f"the ledger topic eos-ledger-{name} has cleanup.policy=delete"):
        run_in_process(spark, write_pipeline(tmp_path, config))
    assert not (tmp_path / "ck" / "_eos" / "pipeline.json").exists()
    assert_nothing_written(bootstrap, sink)


def test_python_worker_reuse_off_is_refused(bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(), new_topic()
    config = passthrough_pipeline(unique_name("p"), bootstrap, source, sink, tmp_path / "ck")
    config["spark"] = {"conf": {"spark.python.worker.reuse": "false"}}
    finished = eos_subprocess("run", str(write_pipeline(tmp_path, config)))
    assert finished.returncode == 2, finished.output[-3000:]
    assert "spark.python.worker.reuse is false" in last_error(finished.output)

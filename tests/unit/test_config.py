"""Pipeline config: parsing, validation messages, env interpolation, secret masking (pure logic)."""

from __future__ import annotations

import pytest

from eos.config import parse_duration, parse_pipeline, redacted
from eos.errors import ConfigError
from eos_connectors.kafka.ids import default_prefix, pool_id

MINIMAL = """
name: p1
checkpoint: /tmp/ck
sources:
  - name: events
    kafka: {bootstrap: "b:9092", topics: [in]}
sinks:
  - name: out
    kafka: {bootstrap: "b:9092", topic: out}
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("200ms", 0.2), ("500 milliseconds", 0.5), ("2s", 2.0), ("90 seconds", 90.0), ("1m", 60.0),
     ("1 minute", 60.0), ("5 mins", 300.0), ("1.5h", 5400.0), (3, 3.0), ("0s", 0.0)],
)  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "10", "5 parsecs", "-1s", True])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_minimal_pipeline_has_safe_defaults():
    config = parse_pipeline(MINIMAL)
    assert config.epochs.mode == "exactly-once"
    assert config.sources[0].kafka.isolation == "read_committed"
    assert config.sources[0].on_error == "fail"
    assert config.ledger_topic == "eos-ledger-p1"
    assert pool_id(default_prefix(config.name), config.sinks[0].name, 3) == "eos/p1/out/3"
    assert config.sink_input(config.sinks[0]) == "events"


def test_epoch_knobs():
    config = parse_pipeline(
        MINIMAL + "epochs: {trigger: 250ms, min_pause: 2s, timeout: 1 minute, tolerable_failures: 5, slots: 4}\n"
    )
    assert (config.epochs.trigger_seconds, config.epochs.min_pause, config.epochs.timeout) == (0.25, 2.0, 60.0)
    assert (config.epochs.tolerable_failures, config.epochs.slots) == (5, 4)


def test_errors_name_file_line_and_field():
    with pytest.raises(ConfigError) as error:
        parse_pipeline(MINIMAL.replace("topics: [in]", "topics: [in], max_records_per_epoc: 10"))
    message = str(error.value)
    assert "<string>:6" in message
    assert "unknown field 'sources.0.kafka.max_records_per_epoc'" in message
    assert "did you mean 'max_records_per_epoch'" in message


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as error:
        parse_pipeline("name: 'bad name'\ncheckpoint: /x\nsinkz: []\n")
    message = str(error.value)
    assert "3 problems" in message or "4 problems" in message
    assert "missing required field 'sources'" in message
    assert "unknown field 'sinkz'; did you mean 'sinks'?" in message


def test_references_are_checked():
    text = MINIMAL + "transforms:\n  - name: t\n    python: m:f\n    input: nowhere\n"
    with pytest.raises(ConfigError, match="input 'nowhere' is not defined before it"):
        parse_pipeline(text)
    with pytest.raises(ConfigError, match="exactly one of `sql:` or `python"):
        parse_pipeline(MINIMAL + "transforms:\n  - name: t\n")
    with pytest.raises(ConfigError, match="on_error: dlq needs dlq_topic"):
        parse_pipeline(MINIMAL.replace("topics: [in]}", "topics: [in]}\n    on_error: dlq"))


def test_environment_interpolation_and_missing_variables():
    text = MINIMAL.replace('"b:9092", topics', '"${BROKERS}", topics').replace("/tmp/ck", "${CK:-/tmp/default}")
    config = parse_pipeline(text, env={"BROKERS": "k1:9092,k2:9092"})
    assert config.sources[0].kafka.bootstrap == "k1:9092,k2:9092"
    assert config.checkpoint == "/tmp/default"
    with pytest.raises(ConfigError, match="<string>:6: environment variable BROKERS is not set"):
        parse_pipeline(text, env={})


def test_secrets_are_masked_wherever_config_is_shown():
    text = MINIMAL.replace(
        "topics: [in]}",
        'topics: [in], config: {sasl.password: "${PW}", sasl.username: u, security.protocol: SASL_SSL}}',
    )
    config = parse_pipeline(text, env={"PW": "hunter2"})
    assert config.sources[0].kafka.config["sasl.password"] == "hunter2"  # the client gets it
    shown = redacted(config)
    assert shown["sources"][0]["kafka"]["config"] == {
        "sasl.password": "***", "sasl.username": "u", "security.protocol": "SASL_SSL"
    }  # fmt: skip
    assert "hunter2" not in repr(shown)


def test_invalid_yaml_names_the_line():
    with pytest.raises(ConfigError, match=r"<string>:3:\d+: invalid YAML: mapping values are not allowed here"):
        parse_pipeline("name: p\ncheckpoint: /x\nsources: a: b\nsinks: []\n")

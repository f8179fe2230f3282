"""A schema registry's options in the pipeline file: credentials (in the URL or as options) are
masked wherever config is shown and never reach what the checkpoint pins, so rotating them is no
change of the replay config; the registry's URL is (another registry, other schemas per id)."""

from __future__ import annotations

import json

import pytest

from eos.config import parse_pipeline, redacted
from eos.declared import connectors, pipeline_info, replay_config
from eos.errors import ConfigError
from eos.protocol.plan import digest
from eos.runner import describe_plan

OLD, NEW, TOKEN = "canary-old-pw-41f7", "canary-new-pw-9c2e", "canary-token-77ab"

PIPELINE = """
name: p
checkpoint: /tmp/ck
sources:
  - name: users
    kafka: {{bootstrap: "b:9092", topics: [in]}}
    value_format: {{type: avro, registry: {source}, subject: in-value}}
sinks:
  - name: out
    kafka: {{bootstrap: "b:9092", topic: out}}
    value: "struct(id)"
    value_format: {{type: avro, registry: {sink}, subject: out-value}}
"""


def pipeline(source: str, sink: str | None = None):
    return parse_pipeline(PIPELINE.format(source=source, sink=sink or source))


def pinned(config) -> dict:
    """What the checkpoint keeps while an epoch is pending (eos.runner.prepare_checkpoint)."""
    return replay_config(config, connectors(config, pipeline_info(config, "ck", None)), 2)


def test_rotating_the_registry_password_is_no_change_of_the_replay_config():
    """Failed before the fix: the password written in the URL was pinned in the checkpoint, so a
    new password changed the replay digest, and a restart with an epoch pending was refused."""
    in_url = pipeline(f'"https://eos:{OLD}@reg:8081/apis/ccompat/v7"')
    rotated = pipeline(f'"https://eos:{NEW}@reg:8081/apis/ccompat/v7"')
    assert digest(pinned(in_url)) == digest(pinned(rotated))
    text = json.dumps(pinned(in_url))
    assert OLD not in text and "eos:" not in text
    assert "https://reg:8081/apis/ccompat/v7" in text
    as_options = pipeline(
        f'{{url: "https://reg:8081/apis/ccompat/v7", username: eos, password: "{NEW}", ca_file: /etc/ca.pem}}'
    )
    with_token = pipeline(f'{{url: "https://reg:8081/apis/ccompat/v7", token: "{TOKEN}", ca_file: /etc/ca2.pem}}')
    digests = {digest(pinned(c)) for c in (in_url, rotated, as_options, with_token)}
    assert len(digests) == 1
    moved = pipeline('"https://other-registry:8081/apis/ccompat/v7"')
    assert digest(pinned(moved)) not in digests  # another registry may hold other schemas per id


def test_registry_secrets_are_masked_wherever_config_is_shown():
    config = pipeline(f'"https://eos:{OLD}@reg:8081/apis/ccompat/v7"', f'{{url: "https://reg", token: "{TOKEN}"}}')
    fmt = config.sources[0].value_format
    assert fmt.registry.url == "https://reg:8081/apis/ccompat/v7"  # the userinfo moved out of the URL
    assert (fmt.registry.username, fmt.registry.password) == ("eos", OLD)  # the client gets them
    shown = json.dumps(redacted(config))
    assert OLD not in shown and TOKEN not in shown and '"password": "***"' in shown
    assert OLD not in repr(config) and TOKEN not in repr(config)
    assert not any(OLD in line or TOKEN in line for line in describe_plan(config))


def test_a_mistyped_registry_url_is_reported_without_its_credentials():
    """Failed before the fix: the error quoted the URL, password and all."""
    with pytest.raises(ConfigError) as raised:
        pipeline(f'"htps://eos:{OLD}@reg:8081"')
    assert "expected an http(s):// URL" in str(raised.value) and OLD not in str(raised.value)


@pytest.mark.parametrize(
    "registry, problem",
    [
        ('{url: "https://reg", username: eos}', "needs both username and password"),
        (f'{{url: "https://reg", username: eos, password: x, token: "{TOKEN}"}}', "either username/password or token"),
        (f'{{url: "https://eos:{OLD}@reg", password: x}}', "credentials are given twice"),
        ('{url: "http://reg", ca_file: ca.pem}', "ca_file is for an https:// registry"),
        ('{url: "file:schemas", username: a, password: b}', "a file: registry takes no username"),
    ],
)
def test_registry_options_that_do_not_fit_together(registry, problem):
    with pytest.raises(ConfigError, match=problem) as raised:
        pipeline(registry)
    assert OLD not in str(raised.value) and TOKEN not in str(raised.value)

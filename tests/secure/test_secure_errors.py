"""What a user sees when the secured cluster refuses them: a wrong password is named as refused
credentials, at once (no retries, no "is the broker running?"), and never quoted."""

from __future__ import annotations

import time

import pytest

from eos.errors import EnvironmentProblem
from eos_connectors.kafka.clients import admin_client, describe_topics, reachable


def test_refused_credentials_are_named_at_once_and_not_retried(secure_kafka, unique_name):
    settings = dict(secure_kafka.settings(unique_name("user")))
    settings["sasl.password"] = "canary-wrong-password-8a1f"
    admin = admin_client(settings)
    started = time.monotonic()
    with pytest.raises(EnvironmentProblem) as refused:
        reachable("source s", secure_kafka.bootstrap, lambda: describe_topics(admin, ["any"], timeout=5))
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert "refused this client's credentials" in message and "SASL authentication" in message, message
    assert "sasl.password" in message  # the hint says what to check ...
    assert "canary-wrong-password-8a1f" not in message  # ... and never what was given
    assert "attempt" not in message and elapsed < 15, f"{elapsed:.1f} s: {message}"  # one try, not three

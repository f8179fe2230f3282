"""The ledger topic is checked even when the broker asked has not yet learnt of it: CreateTopics
returns once the controller has committed a topic, and each broker learns of it a moment later.
Pure logic: the admin calls are replaced by a broker that knows the topic only from its fourth
question on."""

from __future__ import annotations

import pytest

from eos_connectors.kafka import ledger
from eos_connectors.kafka.clients import TopicInfo, UnknownTopic


class LaggingBroker:
    def __init__(self, learns_after: int):
        self.asked = 0
        self.learns_after = learns_after

    def describe(self, admin, topics, timeout: float = 10.0):
        self.asked += 1
        name = next(iter(topics))
        if self.asked <= self.learns_after:
            raise UnknownTopic(name)
        return {name: TopicInfo(name, "id", [0], 1)}


@pytest.fixture
def broker(monkeypatch):
    lagging = LaggingBroker(learns_after=3)
    monkeypatch.setattr(ledger, "broker_count", lambda admin: 1)
    monkeypatch.setattr(ledger, "describe_topics", lagging.describe)
    monkeypatch.setattr(ledger, "topic_settings", lambda admin, topic: {"cleanup.policy": "compact"})
    monkeypatch.setattr(ledger, "create_topic", lambda *args, **kwargs: False)  # the controller has it
    return lagging


def test_a_ledger_topic_the_broker_has_not_learnt_of_yet_is_checked_once_it_has(broker) -> None:
    ledger.ensure_ledger_topic({}, "eos-ledger-x", admin=object())
    assert broker.asked == 4  # the first describe, two more that found nothing, the one that did


def test_a_ledger_topic_that_never_appears_is_still_an_error(broker, monkeypatch) -> None:
    broker.learns_after = 10**9
    monkeypatch.setattr(ledger, "_once_visible", _quick(ledger._once_visible))
    with pytest.raises(UnknownTopic):
        ledger.ensure_ledger_topic({}, "eos-ledger-x", admin=object())


def _quick(once_visible):
    return lambda admin, topic: once_visible(admin, topic, timeout_s=0.3)

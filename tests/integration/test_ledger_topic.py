"""The ledger topic and the control topic keep their entries for ever (issue 35, section 7): a
topic whose cleanup.policy also deletes by retention (`compact,delete`) is refused, as one that
only deletes is. After an outage longer than the retention the entries and the decision would be
gone, and the replay would write committed epochs again. A real broker."""

from __future__ import annotations

import socket

import pytest

from eos.errors import ConfigError
from eos.protocol.decision import DriverInfo
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.ledger import ensure_ledger_topic


@pytest.mark.parametrize("policy", ["compact,delete", "delete,compact", "delete"])
def test_a_ledger_topic_that_deletes_by_retention_is_refused(bootstrap, new_topic, policy: str):
    topic = new_topic(prefix="ledger", config={"cleanup.policy": policy})
    with pytest.raises(ConfigError, match=f"the ledger topic {topic} has cleanup.policy={policy}: retention"):
        ensure_ledger_topic({"bootstrap.servers": bootstrap}, topic)


def test_a_control_topic_that_deletes_by_retention_is_refused(bootstrap, new_topic, unique_name):
    topic = new_topic(prefix="ledger", config={"cleanup.policy": "compact,delete"})
    log = KafkaControlLog({"bootstrap.servers": bootstrap}, topic, unique_name("p"))
    try:
        with pytest.raises(ConfigError, match=r"cleanup\.policy=compact,delete"):
            log.take_over(DriverInfo("r1", socket.gethostname(), 1, "127.0.0.1:1"))
    finally:
        log.close()


def test_a_compacted_ledger_topic_is_accepted(bootstrap, new_topic):
    topic = new_topic(prefix="ledger", config={"cleanup.policy": "compact"})
    ensure_ledger_topic({"bootstrap.servers": bootstrap}, topic)

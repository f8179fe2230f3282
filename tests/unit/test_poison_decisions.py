"""Poison decisions (eos.protocol.poison): what a read task asks for crosses to the driver intact,
the driver records it in the checkpoint before the next attempt (and only what is new), and
refuses one for an epoch whose commit decision is recorded. The routing by recorded decisions,
on a real registry, broker and Spark: tests/integration/test_registry.py."""

from __future__ import annotations

import pytest

from eos.errors import PoisonDecision, SourceFailed, from_spark, to_wire
from eos.protocol import poison
from eos.protocol.checkpoint import Checkpoint, CheckpointMeta
from eos.protocol.committer import EpochCommitter
from eos.protocol.decision import Decision
from eos.protocol.sink import PipelineInfo


def test_a_poison_decision_crosses_the_task_boundary_with_its_decisions():
    asked = PoisonDecision("source users: schema id 7 ...", source="users", decisions=["https://reg#7"])
    rebuilt = from_spark(RuntimeError(f"Task failed: {to_wire(asked)} (and Spark's own words)"))
    assert isinstance(rebuilt, PoisonDecision)
    assert (rebuilt.source, rebuilt.decisions, rebuilt.message) == ("users", ["https://reg#7"], asked.message)


def test_the_driver_records_decisions_durably_once_and_never_for_a_decided_epoch(tmp_path):
    checkpoint = Checkpoint(str(tmp_path / "ck"))
    meta = CheckpointMeta("p", "ck-id", "exactly-once", {}, {}, "digest")
    committer = EpochCommitter(
        None, PipelineInfo("p", "ck-id", True, 60.0), [], (), checkpoint, "digest", None, None, {}, 3, meta=meta
    )
    asked = PoisonDecision("source users: ...", source="users", decisions=["r#9", "r#7"])
    assert committer._record_poison(4, asked)
    stored = checkpoint.read_meta()
    assert stored is not None and stored.poison == {"users": ["r#7", "r#9"]}  # on disk before the retry
    assert not committer._record_poison(4, asked)  # nothing new: a failure like any other
    assert poison.job_property(meta.poison) == '{"users": ["r#7", "r#9"]}'
    assert poison.job_property({}) is None
    committer.decision = Decision(5, 1, "run", {"out": ["h"]})
    with pytest.raises(SourceFailed, match="epoch 5 is already partly committed"):
        committer._record_poison(5, PoisonDecision("source users: ...", source="users", decisions=["r#8"]))
    assert checkpoint.read_meta().poison == {"users": ["r#7", "r#9"]}  # nothing recorded


def test_a_task_outside_a_recorded_job_sees_no_decisions():
    assert poison.recorded("users") == frozenset()  # no Spark task here: nothing recorded

"""The slot tasks' plan: what stays the same from epoch to epoch is pickled into the job's function
once, and the epoch attempt a job writes travels in the job's local property (EPOCH_PROPERTY)."""

from __future__ import annotations

import json

import pytest

from eos.errors import SlotAborted
from eos.protocol.plan import EpochPlan, SinkPlan
from eos.protocol.sink import PipelineInfo
from eos.protocol.slot import epoch_property, task_plan, unchanging


def plan(epoch: int = 7, attempt: int = 2, skip: frozenset[tuple[str, int]] = frozenset()) -> EpochPlan:
    return EpochPlan(
        pipeline=PipelineInfo("orders", "ck-id", True, 60.0),
        epoch=epoch,
        attempt=attempt,
        run="run-a",
        offsets=f"digest-of-offsets-{epoch}",
        config="config-digest",
        sinks=(SinkPlan("out", 0, None, True), SinkPlan("audit", 1, None, True)),
        skip=skip,
        coordinator=None,
        timeout_s=60.0,
    )


def test_a_task_rebuilds_its_epochs_plan_from_the_unchanging_part_and_the_jobs_property():
    for epoch, attempt, skip in [(0, 1, frozenset()), (7, 3, frozenset({("out", 1), ("audit", 0)}))]:
        whole = plan(epoch, attempt, skip)
        assert task_plan(unchanging(whole), epoch_property(whole)) == whole
    # Every epoch shares one unchanging part: the function pickled with it is made once.
    assert unchanging(plan(1)) == unchanging(plan(2, 5, frozenset({("out", 0)})))


def test_the_jobs_property_holds_no_secret_and_nothing_of_the_sinks():
    said = json.loads(epoch_property(plan(skip=frozenset({("out", 1)}))))
    assert set(said) == {"pipeline", "run", "epoch", "attempt", "offsets", "skip"}
    assert said["skip"] == [["out", 1]]


def test_a_task_without_its_jobs_property_or_with_another_runs_is_refused():
    base = unchanging(plan())
    with pytest.raises(SlotAborted, match=r"no eos\.epoch"):
        task_plan(base, None)
    other = epoch_property(EpochPlan(**{**plan().__dict__, "run": "run-b"}))
    with pytest.raises(SlotAborted, match="run run-b"):
        task_plan(base, other)

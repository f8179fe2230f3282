"""The source's planning math (pure): fair admission, new partitions, task splitting."""

from __future__ import annotations

import random

import pytest

from eos_connectors.kafka.offsets import (
    MIN_CHUNK,
    chunk_size,
    decode,
    encode,
    fair_share,
    pack,
    plan_ends,
    split_ranges,
)


def test_fair_share_gives_each_partition_an_equal_share_and_redistributes_leftovers():
    grant = fair_share({("t", 0): 1_000_000, ("t", 1): 10, ("t", 2): 500}, 900)
    assert grant == {("t", 0): 445, ("t", 1): 10, ("t", 2): 445}


def test_a_hot_partition_cannot_starve_the_others():
    available = {("hot", 0): 10_000_000, **{("cold", p): 50 for p in range(8)}}
    grant = fair_share(available, 1000)
    assert all(grant[("cold", p)] == 50 for p in range(8))
    assert grant[("hot", 0)] == 600


@pytest.mark.parametrize("seed", range(20))
def test_fair_share_properties(seed):
    rng = random.Random(seed)
    available = {
        ("t", p): rng.choice([0, 1, rng.randrange(1000), rng.randrange(10**6)]) for p in range(rng.randrange(1, 12))
    }
    budget = rng.randrange(0, 5000)
    grant = fair_share(available, budget)
    assert sum(grant.values()) == min(budget, sum(available.values()))
    assert all(0 <= grant[tp] <= available[tp] for tp in available)
    # Nobody got less than an equal share unless it wanted less.
    equal = budget // max(1, len(available))
    assert all(grant[tp] >= min(available[tp], equal) for tp in available)
    assert fair_share(available, budget) == grant  # deterministic


def test_plan_ends_admits_at_most_the_budget_and_new_partitions_start_at_zero():
    start = {("t", 0): 100, ("t", 1): 50}
    latest = {("t", 0): 1100, ("t", 1): 60, ("t", 2): 30}  # partition 2 is new
    ends = plan_ends(start, latest, 300)
    assert sum(ends[tp] - start.get(tp, 0) for tp in ends) == 300
    assert ends[("t", 1)] == 60 and ends[("t", 2)] == 30
    assert plan_ends(start, latest, None) == latest


def test_split_ranges_cuts_large_partitions_into_tasks():
    ranges = split_ranges({("t", 0): 0, ("t", 1): 5}, {("t", 0): 250, ("t", 1): 5, ("t", 2): 40}, 100)
    assert [(r.topic, r.partition, r.start, r.end) for r in ranges] == [
        ("t", 0, 0, 100), ("t", 0, 100, 200), ("t", 0, 200, 250), ("t", 2, 0, 40)
    ]  # fmt: skip


def _tasks(start, end, tasks, max_per_task=200_000):
    ranges = split_ranges(start, end, chunk_size(start, end, tasks, max_per_task))
    return [sum(r.end - r.start for r in task) for task in pack(ranges, tasks)]


def test_one_hot_partition_is_still_read_by_every_task():
    # Once the cold partitions are drained, an epoch is one partition's range: one task read it
    # and the other core idled.
    assert _tasks({("t", 0): 0}, {("t", 0): 50_000}, 2) == [25_000, 25_000]
    assert _tasks({("t", 0): 100}, {("t", 0): 50_100, ("t", 1): 0}, 3) == [16_667, 16_667, 16_666]
    hot_and_cold = {("t", 0): 30_000, ("t", 1): 3_000, ("t", 2): 3_000, ("t", 3): 3_000}
    assert sorted(_tasks({}, hot_and_cold, 2)) == [19_500, 19_500]


def test_small_epochs_and_max_records_per_task_bound_the_cut():
    assert _tasks({}, {("t", 0): MIN_CHUNK}, 2) == [MIN_CHUNK]  # too small to be worth a second task
    assert _tasks({}, {("t", 0): 10, ("t", 1): 10, ("t", 2): 10, ("t", 3): 10}, 2) == [20, 20]
    assert _tasks({}, {("t", 0): 90_000}, 2, max_per_task=20_000) == [50_000, 40_000]  # chunks of 20,000
    assert chunk_size({}, {}, 2, 200_000) == MIN_CHUNK


def test_offsets_round_trip_in_sparks_json_form():
    offsets = {("b", 1): 7, ("a", 0): 3, ("a", 10): 9}
    assert encode(offsets) == {"a": {"0": 3, "10": 9}, "b": {"1": 7}}
    assert decode(encode(offsets)) == offsets


@pytest.mark.parametrize("seed", range(20))
def test_packing_balances_tasks_and_is_a_function_of_the_ranges(seed):
    """Ranges packed into read tasks: every range exactly once, at most `tasks` tasks, no task
    more than the largest range above the average, and the same packing whatever order the ranges
    come in (a replayed epoch must give every slot the same records)."""
    rng = random.Random(seed)
    start = {("t", p): rng.randrange(0, 1000) for p in range(rng.randrange(1, 9))}
    end = {tp: offset + rng.randrange(0, 5000) for tp, offset in start.items()}
    ranges = split_ranges(start, end, rng.choice([100, 1000, 200_000]))
    tasks = rng.randrange(1, 6)
    packed = pack(ranges, tasks)
    assert len(packed) == min(tasks, len(ranges))
    assert sorted(r for task in packed for r in task) == sorted(ranges)
    loads = [sum(r.end - r.start for r in task) for task in packed]
    if ranges:
        assert max(loads) - sum(loads) / len(loads) <= max(r.end - r.start for r in ranges)
    shuffled = ranges[:]
    rng.shuffle(shuffled)
    assert pack(shuffled, tasks) == packed

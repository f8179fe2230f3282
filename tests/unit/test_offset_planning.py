"""The source's planning math (pure): fair admission, new partitions, task splitting."""

from __future__ import annotations

import random

import pytest

from eos_connectors.kafka.offsets import decode, encode, fair_share, plan_ends, split_ranges


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


def test_offsets_round_trip_in_sparks_json_form():
    offsets = {("b", 1): 7, ("a", 0): 3, ("a", 10): 9}
    assert encode(offsets) == {"a": {"0": 3, "10": 9}, "b": {"1": 7}}
    assert decode(encode(offsets)) == offsets


@pytest.mark.parametrize("seed", range(10))
def test_a_follower_never_gets_ahead_of_its_leader_and_catches_up(seed):
    """Two branches of one source plan epoch after epoch while data keeps arriving; the follower
    may start behind (a restart) but never passes the leader, and reaches it once input stops."""
    from eos_connectors.kafka.offsets import follow

    rng = random.Random(seed)
    parts = [("t", p) for p in range(rng.randrange(1, 5))]
    latest = {tp: rng.randrange(0, 500) for tp in parts}
    leader = {tp: rng.randrange(0, latest[tp] + 1) for tp in parts}
    follower = {tp: rng.randrange(0, leader[tp] + 1) for tp in parts}
    budget = rng.randrange(1, 300)
    for step in range(5000):  # input arrives for 30 steps, then stops
        if step < 30:
            latest = {tp: n + rng.randrange(0, 50) for tp, n in latest.items()}
        elif follower == leader == latest:
            break
        leader = plan_ends(leader, latest, budget)
        nxt = follow(follower, plan_ends(follower, latest, budget), leader)
        assert all(follower[tp] <= nxt[tp] <= leader[tp] for tp in parts)
        follower = nxt
    assert follower == leader == latest


@pytest.mark.parametrize("seed", range(5))
def test_both_branches_plan_the_same_epoch_whichever_spark_asks_first(tmp_path, seed):
    """Spark asks the view and poison branches for their end offsets in an order of its own; the
    second adopts the first's plan, so both advance together and no extra epoch is needed."""
    from eos_connectors.kafka.source import PlanBook

    rng = random.Random(seed)
    start = {"leader": encode({("t", 0): 0}), "follower": encode({("t", 0): 0})}
    latest = 0
    for _ in range(40):
        latest += rng.choice([0, 0, 7, 100])  # some triggers find no new data
        for role in rng.sample(["leader", "follower"], 2):
            book = PlanBook(tmp_path, "run")  # opened per call, as latestOffset does
            end = book.take(start[role], role)
            if end is None:
                end = encode({("t", 0): min(latest, decode(start[role])[("t", 0)] + 50)})
                book.offer(start[role], end, role)
            start[role] = end  # Spark runs the epoch and the end becomes the next start
        assert start["leader"] == start["follower"]
        assert PlanBook(tmp_path, "run").leader_end() == start["leader"]

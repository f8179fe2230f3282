"""Offset planning math for the source: pure functions, no Kafka.

An epoch's plan maps each (topic, partition) to an end offset. Spark logs it (the barrier)
before any record is read, and a replay of the epoch reads exactly the same ranges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


def encode(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The JSON form Spark logs: {"topic": {"partition": offset}}, sorted for stable logs."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def decode(data: Mapping[str, Mapping[str, int]] | None) -> Offsets:
    return {(topic, int(p)): int(o) for topic, parts in (data or {}).items() for p, o in parts.items()}


def fair_share(available: Mapping[TopicPartition, int], budget: int) -> dict[TopicPartition, int]:
    """Split `budget` records across partitions by water-filling.

    Every partition gets an equal share; what small partitions do not need is redistributed to
    the others. One hot partition therefore cannot starve the rest, and the rest cannot hold
    the hot one back once they are drained (seed 001's stall). Deterministic: ties go to the
    smallest (topic, partition)."""
    grant = {tp: 0 for tp in available}
    remaining = {tp: n for tp, n in available.items() if n > 0}
    left = max(0, budget)
    while remaining and left > 0:
        share, extra = divmod(left, len(remaining))
        for index, tp in enumerate(sorted(remaining)):
            want = remaining[tp]
            give = min(want, share + (1 if index < extra else 0))
            grant[tp] += give
            left -= give
            if give == want:
                del remaining[tp]
            else:
                remaining[tp] = want - give
        if share == 0 and extra == 0:
            break
    return grant


def plan_ends(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_records: int | None
) -> Offsets:
    """End offsets for the next epoch: `latest`, capped so that at most `max_records` offsets
    are admitted, spread fairly. Partitions missing from `start` start at offset 0 (new ones)."""
    begin = {tp: start.get(tp, 0) for tp in latest}
    available = {tp: max(0, latest[tp] - begin[tp]) for tp in latest}
    granted = available if max_records is None else fair_share(available, max_records)
    ends = {tp: begin[tp] + granted[tp] for tp in latest}
    # Partitions that exist in `start` but vanished from `latest` keep their offset; the
    # caller decides whether a vanished topic is an error.
    for tp, offset in start.items():
        ends.setdefault(tp, offset)
    return ends


@dataclass(frozen=True, order=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive


# Below this many offsets a range is not cut to spread an epoch over its tasks: a small epoch
# gains nothing from a second read task.
MIN_CHUNK = 1_000
# Names how an epoch's ranges become read tasks (chunk_size, split_ranges, pack). Changing any of
# them changes which slot writes which records, so the name is part of the source's replay
# identity: a pending epoch is never replayed cut another way than it was planned.
READ_TASKS = "even-share-1"


def chunk_size(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], tasks: int, max_per_task: int
) -> int:
    """The most offsets one range of the epoch may span: an even share of the epoch's offsets
    per task, so that an epoch whose offsets lie in few partitions (one hot partition, once the
    others are drained) is still read by every task; never more than max_per_task, never less
    than MIN_CHUNK. With the whole epoch in one range, one of two cores read it while the other
    idled: the skewed input ran at 0.54x the uniform one's rate."""
    total = sum(max(0, hi - start.get(tp, 0)) for tp, hi in end.items())
    share = -(-total // max(1, tasks))
    return max(1, min(max_per_task, max(MIN_CHUNK, share)))


def split_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], max_per_task: int):
    """Ranges [start, end) per partition, each cut into chunks of at most max_per_task offsets,
    so a large partition is read by several Spark tasks in parallel."""
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        lo, hi = start.get(tp, 0), end[tp]
        while lo < hi:
            cut = min(hi, lo + max_per_task)
            ranges.append(OffsetRange(tp[0], tp[1], lo, cut))
            lo = cut
    return ranges


def pack(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """Pack ranges into at most `tasks` read tasks, balancing offsets: largest range first onto
    the least loaded task (ties: the lower task). A deterministic function of the ranges, so a
    replayed epoch has the same tasks, each with the same ranges; within a task, ranges are in
    (topic, partition, start) order."""
    if not ranges:
        return []
    bins: list[list[OffsetRange]] = [[] for _ in range(min(max(1, tasks), len(ranges)))]
    load = [0] * len(bins)
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.topic, r.partition, r.start)):
        target = min(range(len(bins)), key=lambda i: (load[i], i))
        bins[target].append(r)
        load[target] += r.end - r.start
    return [sorted(b, key=lambda r: (r.topic, r.partition, r.start)) for b in bins]

"""Built-in Python transforms, usable as `python: eos.transforms:NAME` in a pipeline file.

A Python transform takes the input view as a streaming DataFrame (plus `args`) and returns one.
It must be deterministic given its input and state: a replayed epoch must produce the same
records, or exactly-once output cannot hold (see docs/EXACTLY_ONCE.md).
"""

from __future__ import annotations


def drop_duplicates(df, columns: list[str], within_watermark: bool = True):
    """Drop records whose `columns` were seen before. With a watermark on the source (the
    default), state is kept only as long as the watermark allows a duplicate to arrive."""
    if within_watermark:
        return df.dropDuplicatesWithinWatermark(columns)
    return df.dropDuplicates(columns)

"""The fault matrix (issue 4): crash a pipeline at every protocol point, restart it until it has
caught up, and prove with `eos verify` that nothing was lost or duplicated. The same matrix in
at-least-once mode is the negative control: the verifier must catch its duplicates.

Every run is a real `eos run` process against a real broker; crashes are `kill -9` of the driver's
process group (driver, Spark JVM, Python workers) at a named failpoint.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from eos.failpoints import PROTOCOL_POINTS
from tests.pipelines import (
    eos_subprocess,
    passthrough_pipeline,
    produce_numbered,
    write_pipeline,
)
from tests.support import independent_committed_values

# Points reached after the slots' records are in the log: a crash there leaves aborted records
# behind (exactly-once) or visible ones that a replay writes again (at-least-once).
AFTER_WRITE = {"sink.after_precommit", "sink.after_agreement", "sink.between_commits", "epoch.after_commit"}


def run_until_done(path: Path, *extra: str, attempts: int = 4) -> list[str]:
    """Restart `eos run` until it exits 0 (a failpoint fires once; later runs pass it)."""
    outputs = []
    for _ in range(attempts):
        finished = eos_subprocess("run", str(path), *extra)
        outputs.append(finished.output)
        if finished.returncode == 0:
            return outputs
        assert finished.killed or "error" in finished.output, finished.output[-3000:]
    raise AssertionError("the pipeline never finished:\n" + outputs[-1][-3000:])


def eos_verify(*args: str) -> dict:
    result = eos_subprocess("verify", "--json", *args, timeout=120)
    report = json.loads(result.output[result.output.index("{") :])
    assert (result.returncode == 0) == report["ok"], result.output
    return report


def crash_and_recover(bootstrap, new_topic, unique_name, tmp_path, point: str, mode: str) -> tuple[dict, list, list]:
    """`eos verify`'s report, the input values, and the output as a second, independent reader sees it."""
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    sent = produce_numbered(bootstrap, source, 0, 900)
    config = passthrough_pipeline(
        unique_name("p"), bootstrap, source, sink, tmp_path / "ck", mode=mode, max_records_per_epoch=400
    )
    path = write_pipeline(tmp_path, config)
    crashed = eos_subprocess("run", str(path), "--failpoint", f"{point}=kill@epoch=1")
    assert crashed.killed, f"the failpoint {point} did not fire:\n{crashed.output[-3000:]}"
    assert f"kill -9 at {point}" in crashed.output
    run_until_done(path)
    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    return report, sent, independent_committed_values(bootstrap, sink)


@pytest.mark.parametrize("point", PROTOCOL_POINTS)
def test_exactly_once_through_a_crash_at(point, bootstrap, new_topic, unique_name, tmp_path):
    report, sent, seen = crash_and_recover(bootstrap, new_topic, unique_name, tmp_path, point, "exactly-once")
    assert report["ok"], report
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0)
    assert sorted(seen) == sorted(sent)  # the second reader agrees
    assert report["output_records"] == report["input_records"] == 900
    if point in AFTER_WRITE - {"epoch.after_commit"}:
        assert report["aborted_records_seen"] > 0, "the crash left no aborted records: did it hit mid-epoch?"


@pytest.mark.parametrize("point", PROTOCOL_POINTS)
def test_negative_control_at_least_once_duplicates_are_caught(point, bootstrap, new_topic, unique_name, tmp_path):
    """The same crash without the protocol: a replay writes again what was already visible, and
    the verifier must say so. If this passed silently, the verifier could not fail."""
    report, sent, seen = crash_and_recover(bootstrap, new_topic, unique_name, tmp_path, point, "at-least-once")
    assert report["lost"] == 0  # at-least-once never loses
    # The second reader agrees on which records came out more than once.
    assert sum(n > 1 for n in Counter(seen).values()) == report["duplicated"] and set(seen) == set(sent), report
    if point in AFTER_WRITE:
        assert not report["ok"] and report["duplicated"] > 0, report
        assert report["examples"]["duplicated"], report
    elif point == "epoch.after_offsets_logged":  # crashed before anything was written
        assert report["ok"], report
    else:  # mid-produce: some records may already have been delivered, and then they are caught
        assert report["ok"] == (report["duplicated"] == 0), report

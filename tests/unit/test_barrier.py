"""The scans of one source agree on each epoch's ends (eos.protocol.barrier): pure file logic."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import time
from pathlib import Path

import pytest

from eos.errors import CheckpointError
from eos.protocol.barrier import KEEP, SharedEnds
from eos.protocol.source import StreamOptions

START = {"orders": {"0": 100, "1": 250}}


class Planner:
    """A scan's own planning: counts its calls, returns ends it was given."""

    def __init__(self, ends: dict):
        self.ends, self.calls = ends, 0

    def __call__(self) -> dict:
        self.calls += 1
        return self.ends


def test_a_second_scan_takes_the_first_scans_ends_without_planning(tmp_path: Path):
    main, poison = SharedEnds(str(tmp_path), "run1"), SharedEnds(str(tmp_path), "run1")
    first, second = Planner({"orders": {"0": 160, "1": 300}}), Planner({"orders": {"0": 999, "1": 999}})
    assert main.agree(1, START, first) == {"orders": {"0": 160, "1": 300}}
    assert poison.agree(1, dict(START), second) == {"orders": {"0": 160, "1": 300}}
    assert (first.calls, second.calls) == (1, 0)


def test_the_next_round_plans_afresh_even_from_the_same_start(tmp_path: Path):
    """A round that found nothing new planned no epoch: the next round starts at the same offsets
    and must look at the log again, not take the old (empty) ends."""
    ends = SharedEnds(str(tmp_path), "run1")
    assert ends.agree(1, START, Planner(START)) == START
    assert ends.agree(2, START, Planner({"orders": {"0": 120, "1": 250}})) == {"orders": {"0": 120, "1": 250}}


def test_another_start_or_another_run_plans_afresh(tmp_path: Path):
    ends = SharedEnds(str(tmp_path), "run1")
    ends.agree(1, START, Planner({"orders": {"0": 160, "1": 300}}))
    later = Planner({"orders": {"0": 200, "1": 300}})
    assert ends.agree(2, {"orders": {"0": 160, "1": 300}}, later) == {"orders": {"0": 200, "1": 300}}
    next_run = Planner({"orders": {"0": 170, "1": 310}})
    assert SharedEnds(str(tmp_path), "run2").agree(1, START, next_run) == {"orders": {"0": 170, "1": 310}}
    assert (later.calls, next_run.calls) == (1, 1)


def test_of_two_scans_planning_at_once_the_first_to_publish_wins(tmp_path: Path):
    ends = SharedEnds(str(tmp_path), "run1")

    def slow_plan() -> dict:
        # While this scan plans, another publishes its ends for the same start.
        ends.agree(1, START, Planner({"orders": {"0": 150, "1": 260}}))
        return {"orders": {"0": 180, "1": 290}}

    assert ends.agree(1, START, slow_plan) == {"orders": {"0": 150, "1": 260}}
    assert ends.agree(1, START, Planner({})) == {"orders": {"0": 150, "1": 260}}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_only_the_newest_entries_are_kept(tmp_path: Path):
    ends = SharedEnds(str(tmp_path / "orders"), "run1")
    for n in range(KEEP + 5):
        ends.agree(n, {"orders": {"0": n}}, Planner({"orders": {"0": n + 1}}))
        entry = max((tmp_path / "orders").iterdir(), key=lambda p: p.stat().st_mtime_ns)
        os.utime(entry, ns=(time.time_ns() + n * 1_000_000, time.time_ns() + n * 1_000_000))
    assert len(list((tmp_path / "orders").iterdir())) == KEEP
    newest = Planner({"orders": {"0": -1}})
    assert ends.agree(KEEP + 4, {"orders": {"0": KEEP + 4}}, newest) == {"orders": {"0": KEEP + 5}}
    assert newest.calls == 0
    oldest = Planner({"orders": {"0": 1}})
    ends.agree(0, {"orders": {"0": 0}}, oldest)
    assert oldest.calls == 1


def test_each_source_gets_a_folder_of_its_own_and_the_ends_travel_pickled(tmp_path: Path):
    options = StreamOptions(parallelism=2, barriers=str(tmp_path), run="r1")
    orders, users = options.shared_ends("orders"), options.shared_ends("users")
    assert orders is not None and users is not None and orders.folder != users.folder
    assert pickle.loads(pickle.dumps(orders)) == orders
    assert StreamOptions(parallelism=2).shared_ends("orders") is None


def test_a_filesystem_without_hard_links_still_publishes(tmp_path: Path, monkeypatch):
    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    ends = SharedEnds(str(tmp_path), "run1")
    assert ends.agree(1, START, Planner({"orders": {"0": 160, "1": 300}})) == {"orders": {"0": 160, "1": 300}}
    taken = Planner({})
    assert ends.agree(1, START, taken) == {"orders": {"0": 160, "1": 300}} and taken.calls == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- ends read back are not trusted for being there (issue 35, scratch space) -------------------------


def planted(folder: Path, mode_: int, start: dict, ends: dict, run: str = "run1") -> SharedEnds:
    """Ends for round 1 from `start`, put where a scan would take them, as another user could."""
    folder.mkdir(parents=True)
    os.chmod(folder, mode_)
    key = json.dumps([run, 1, start], sort_keys=True)
    (folder / hashlib.sha256(key.encode()).hexdigest()[:32]).write_text(json.dumps(ends))
    return SharedEnds(str(folder), run)


BELOW = {"orders": {"0": 0, "1": 250}}  # a re-read of offsets 0-99 of partition 0: duplicates
OWN = {"orders": {"0": 150, "1": 250}}  # what the scan plans itself


def test_ends_planted_in_a_folder_others_can_write_are_never_taken(tmp_path: Path, capsys):
    """The folder is replaced by a private one (what it held was not eos's to trust)."""
    ends = planted(tmp_path / "barriers" / "orders", 0o777, START, BELOW)
    assert ends.agree(1, START, Planner(OWN)) == OWN
    assert stat.S_IMODE(Path(ends.folder).stat().st_mode) == 0o700
    assert "replaced it with a private one" in capsys.readouterr().err


def test_ends_planted_in_another_users_folder_are_refused(tmp_path: Path, monkeypatch):
    ends = planted(tmp_path / "barriers" / "orders", 0o700, START, BELOW)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)  # the folder is not ours
    with pytest.raises(CheckpointError, match=r"is a folder of uid .* not of this user's"):
        ends.agree(1, START, Planner(OWN))


def test_a_new_folder_is_private(tmp_path: Path):
    ends = SharedEnds(str(tmp_path / "barriers" / "orders"), "run1")
    ends.agree(1, START, Planner(OWN))
    assert [stat.S_IMODE((tmp_path / p).stat().st_mode) for p in ("barriers", "barriers/orders")] == [0o700, 0o700]


def test_taken_ends_pass_the_check_first(tmp_path: Path):
    ends = SharedEnds(str(tmp_path / "orders"), "run1")
    ends.agree(1, START, Planner(BELOW))  # published by a scan (here: a wrong one)

    def check(taken: dict) -> None:
        raise ValueError(f"refused {taken}")

    with pytest.raises(ValueError, match="refused"):
        ends.agree(1, START, Planner(OWN), check)

"""The guarantee with hot standbys (`eos run --standby`, eos/standby.py): one pipeline, three
driver processes, every failover a standby's, every fault real.

0. Driver A runs; standbys S1 and S2 start and watch it, and A goes on committing.
1. A is killed (kill -9 of its process group) at `sink.after_precommit` in epoch 2. Both standbys
   find it gone in the same moment: exactly one of them (W) takes the pipeline over; the other
   ends up watching W.
2. W stalls inside epoch 4 (a pause failpoint, then SIGSTOP of its whole process group): the other
   standby finds it silent, takes the pipeline over and replays epoch 4. W is resumed: it goes on
   with its stale epoch 4, cannot record a decision, and stands by again. It commits nothing.
3. The other is killed between its slots' commits in epoch 6 (slot 0 committed, slot 1 not); W,
   standing by again, takes over and replays it.

Then `eos verify` and a second, independent reader check every record once, and the control log's
decisions show which driver decided each epoch: never two drivers one epoch, except the epoch a
driver was killed in after deciding, which its successor replays.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from eos.failpoints import release
from tests.faults.test_fault_matrix import eos_verify
from tests.pipelines import ROOT, committed_values, passthrough_pipeline, produce_numbered, write_pipeline
from tests.support import independent_committed_values, read_all


class Driver:
    """`eos run` in a process group of its own, its output read as it comes."""

    def __init__(self, name: str, path: Path, *args: str):
        self.name = name
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eos", "run", str(path), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        self.proc.wait()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, *parts: str, after: int = 0, timeout: float = 300) -> int:
        """The index of the first line from `after` on that holds every part (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for index in range(after, len(self.lines)):
                    if all(part in self.lines[index] for part in parts):
                        return index
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, (
                    f"{self.name} never said {parts!r} (exit code {self.proc.poll()}):\n" + "\n".join(self.lines[-60:])
                )
                self._changed.wait(min(left, 1.0))

    def signal(self, signum: int) -> None:
        """To the whole process group: driver, Spark JVM, Python workers."""
        os.killpg(self.pid, signum)

    def stop(self) -> None:
        """Kill what is left of it (resumed first: a stopped group takes SIGKILL too, but say so)."""
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                break
        self.proc.wait(30)


def wait_until(check, what: str, drivers: list[Driver], timeout: float = 300, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tails = "\n\n".join(f"--- {d.name}:\n" + "\n".join(d.lines[-40:]) for d in drivers)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(every)


def committed(checkpoint: Path, epoch: int) -> bool:
    return (checkpoint / "commits" / str(epoch)).exists()


def control_records(bootstrap: str, name: str) -> tuple[dict[str, int], dict[int, set[str]]]:
    """From the control log's whole history: the pid of each driver run (in the order they took
    over), and the runs that recorded a decision for each epoch."""
    pids, decided = {}, defaultdict(set)
    for message in read_all(bootstrap, f"eos-ledger-{name}.control"):
        if message.value() is None or not message.key().startswith(f"{name}/".encode()):
            continue
        record = json.loads(message.value())
        if record["kind"] == "driver":
            pids[record["run"]] = record["pid"]
        elif record["kind"] == "decision":
            decided[record["epoch"]].add(record["run"])
    return pids, decided


def test_standbys_take_over_a_killed_and_a_stalled_driver_exactly_once(bootstrap, new_topic, unique_name, tmp_path):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    name = unique_name("p")
    checkpoint = tmp_path / "ck"
    config = passthrough_pipeline(name, bootstrap, source, sink, checkpoint, max_records_per_epoch=300, trigger="0.5s")
    path = write_pipeline(tmp_path, config)
    failpoints = checkpoint / "_eos" / "scratch" / "failpoints"
    # Armed in both standbys: a firing is claimed across processes, so whichever runs the epoch first.
    stall = "epoch.after_offsets_logged=pause(600)@epoch=4"
    kill_between = "sink.between_commits=kill@epoch=6"
    sent = produce_numbered(bootstrap, source, 0, 300)
    a = Driver("A", path, "--failpoint", "sink.after_precommit=kill@epoch=2")
    drivers = [a]
    started = time.monotonic()
    try:
        wait_until(lambda: committed(checkpoint, 0), "driver A's epoch 0", drivers)
        armed = ("--failpoint", stall, "--failpoint", kill_between)
        standbys = [Driver(f"S{n}", path, "--standby", *armed) for n in (1, 2)]
        drivers += standbys
        for s in standbys:
            s.wait_for("standing by: watching the driver", f"pid {a.pid} ")
        standing = time.monotonic()
        # Standing by writes nothing and holds no id: A goes on committing, the only driver recorded.
        sent += produce_numbered(bootstrap, source, 300, 300)
        wait_until(lambda: committed(checkpoint, 1), "driver A's epoch 1, the standbys watching", drivers)
        pids, decided = control_records(bootstrap, name)
        assert list(pids.values()) == [a.pid] and set(decided) == {0, 1}, (pids, decided)

        # 1. A killed with epoch 2 pre-committed; both standbys find it gone, one takes over.
        sent += produce_numbered(bootstrap, source, 600, 600)
        assert a.proc.wait(300) == -signal.SIGKILL, a.output[-3000:]
        killed = time.monotonic()
        wait_until(lambda: committed(checkpoint, 3), "epochs 2 and 3 after A's kill", drivers)
        first_failover = time.monotonic() - killed
        pids, _ = control_records(bootstrap, name)
        w = next(s for s in standbys if s.pid == list(pids.values())[-1])  # the driver recorded last
        other = next(s for s in standbys if s is not w)
        w.wait_for("took over as run")
        other.wait_for("watching", f"pid {w.pid} ")  # "now watching", or "standing by: watching" after losing a race

        # 2. W stalls in epoch 4: held by the failpoint (its vote service still answers), then SIGSTOP.
        sent += produce_numbered(bootstrap, source, 1200, 300)
        wait_until(lambda: any(failpoints.glob("epoch_after_offsets_logged*")), "W pausing in epoch 4", drivers)
        quiet = len(other.lines)
        w.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        judged = other.lines[other.wait_for("the driver is gone", after=quiet)]
        silent_for = float(judged.split("after ")[1].split(" s)")[0])
        assert silent_for >= 1.0, judged  # its pings timed out (a stopped process is not refused)
        wait_until(lambda: committed(checkpoint, 4), "the other standby's replay of epoch 4", drivers)
        second_failover = time.monotonic() - stopped
        other.wait_for("took over as run", after=quiet)
        resumed = len(w.lines)
        w.signal(signal.SIGCONT)
        release(failpoints)  # W goes on with epoch 4 as it saw it
        back = w.wait_for("standing by again", after=resumed)
        w.wait_for("standing by: watching the driver", f"pid {other.pid} ", after=back)
        assert not any(" committed | " in line for line in w.lines[resumed:back]), w.lines[resumed:back]

        # 3. The other killed between its commits in epoch 6; W, a standby again, replays it.
        sent += produce_numbered(bootstrap, source, 1500, 600)
        assert other.proc.wait(300) == -signal.SIGKILL, other.output[-3000:]
        wait_until(lambda: committed(checkpoint, 6), "W's replay of epoch 6", drivers)
        w.wait_for("took over as run", after=back)
        done = lambda: len(committed_values(bootstrap, sink)) >= len(sent)  # noqa: E731
        wait_until(done, "all output", drivers, every=1.0)
        os.kill(w.pid, signal.SIGTERM)  # the driver alone, as an operator stops it: it stops the query
        assert w.proc.wait(120) == 0, w.output[-3000:]
    finally:
        for d in drivers:
            d.stop()
    print(
        f"\nstandbys standing by {standing - started:.0f} s after A started; kill -9 -> epochs 2-3 committed "
        f"{first_failover:.1f} s; SIGSTOP -> epoch 4 committed {second_failover:.1f} s; load {os.getloadavg()[0]:.1f}"
    )
    for d in standbys:  # how each standby saw it (which of the two ways the race of step 1 went, say)
        print("\n".join(f"{d.name}: {line}" for line in d.lines if line.startswith("eos: ") and "Spark" not in line))

    report = eos_verify("--bootstrap", bootstrap, "--input", source, "--output", sink)
    assert report["ok"], report
    assert report["output_records"] == report["input_records"] == len(sent) == 2100
    assert report["aborted_records_seen"] > 0, "no aborted records: did the kills land mid-epoch?"
    assert sorted(independent_committed_values(bootstrap, sink)) == sorted(sent)

    # Who decided each epoch: A 0-1; W (its first run) 2-3 and nothing from its stalled epoch 4 on;
    # the other 4-6; W again (a new run, standing by since) its replay of 6 and what came after.
    pids, decided = control_records(bootstrap, name)
    by_pid = {epoch: sorted(pids[run] for run in runs) for epoch, runs in decided.items()}
    assert by_pid[0] == by_pid[1] == [a.pid], by_pid
    assert by_pid[2] == by_pid[3] == [w.pid], by_pid
    assert by_pid[4] == by_pid[5] == [other.pid], by_pid
    assert by_pid[6] == sorted([other.pid, w.pid]), by_pid
    assert all(pids == [w.pid] for epoch, pids in by_pid.items() if epoch > 6), by_pid
    stalled_run = next(iter(decided[2]))
    assert all(stalled_run not in runs for epoch, runs in decided.items() if epoch >= 4), decided


def test_a_standby_builds_for_the_checkpoint_it_takes_over(spark, bootstrap, new_topic, unique_name, tmp_path):
    """What a standby builds from the checkpoint, and what it reads again at the take-over
    (eos.standby: `_build`, `reopen`): the slot count of a pending epoch when `slots` is unset, and
    the checkpoint's identity. In process, on the tests' SparkSession (default parallelism 2); the
    running driver's restarts are written into the checkpoint's metadata as a restart leaves them."""
    from eos.config import load_pipeline
    from eos.protocol.checkpoint import Checkpoint
    from eos.runner import RunOptions
    from eos.standby import RebuildNeeded, _build, reopen
    from tests.pipelines import run_in_process

    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce_numbered(bootstrap, source, 0, 200)
    checkpoint = tmp_path / "ck"
    name = unique_name("p")
    path = write_pipeline(
        tmp_path, passthrough_pipeline(name, bootstrap, source, sink, checkpoint, slots=None, max_records_per_epoch=100)
    )
    config = load_pipeline(path)
    built = []

    def build(file=config):
        built.append(_build(file, tmp_path, spark, RunOptions()))
        return built[-1]

    try:
        # Built before the pipeline's first start: the checkpoint it takes over is another one.
        early = build()
        assert early.opened.meta is None
        assert run_in_process(spark, path).epochs_committed == 2
        with pytest.raises(RebuildNeeded, match="was created while this standby waited"):
            reopen(early)

        # The driver was restarted with 3 slots and died with its last epoch pending: a standby
        # builds with the count the checkpoint records, not with its own default of 2 ...
        files = Checkpoint(str(checkpoint))
        meta = files.read_meta()
        meta.replay["parallelism"] = 3
        files.write_meta(meta)
        last = files.last_committed_epoch()
        (checkpoint / "commits" / str(last)).unlink()
        standby = build()
        assert standby.parallelism == 3
        # While it waits, the driver records a poison decision (it is written back at the take-over:
        # a standby that kept the metadata it was built with would drop it).
        meta.poison = {"events": ["registry#7"]}
        files.write_meta(meta)
        reopen(standby)
        assert standby.opened.pending == last
        assert standby.opened.meta.poison == {"events": ["registry#7"]}
        # ... and, when a restart changed the count while it waited, builds again rather than replay
        # the pending epoch with another count.
        meta.replay["parallelism"] = 4
        files.write_meta(meta)
        with pytest.raises(RebuildNeeded, match=f"epoch {last} is pending with 4 slots .* built with 3"):
            reopen(standby)
        assert build().parallelism == 4
        reopen(built[-1])

        # With `slots` in the file, the file decides (a changed count is the start's check: a changed
        # replay config, refused once the pending epoch may have committed anywhere).
        fixed = config.model_copy(update={"epochs": config.epochs.model_copy(update={"slots": 2})})
        assert build(fixed).parallelism == 2
        reopen(built[-1])
    finally:
        for pipeline in built:
            pipeline.close()

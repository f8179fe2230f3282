"""Named failure-injection points in the epoch protocol (for the fault matrix and `eos soak`).

Arm them with the EOS_FAILPOINTS environment variable or the pipeline's `failpoints:` list:

    EOS_FAILPOINTS="sink.after_precommit=kill@epoch=3,slot=1; sink.mid_produce=raise@times=2"

Each spec is NAME=ACTION[@CONDITIONS]. Actions:
    kill         SIGKILL the driver's whole process group (driver, Spark JVM, Python workers):
                 `kill -9` of the driver, whichever process reaches the point
    raise        raise FailpointError here (a task failure, or a driver failure)
    pause(S)     sleep S seconds (a stall: zombies, timeouts), or until the test releases it
                 (`release(state_dir)`: a file named RELEASE in the failpoints' folder)
Conditions: epoch=N, slot=K, attempt=A (first attempt is 1), times=T (fire at most T times across
all processes and restarts; default 1; 0 = unlimited).

Disarmed, a point costs one attribute check.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

POINTS: dict[str, str] = {
    "source.read": "task: a source read task fails before reading (Spark retries the task; slot = partition)",
    "source.plan": "driver: a scan planned an epoch's end offsets; no other scan has them, Spark has not logged them",
    "epoch.after_offsets_logged": "driver: the epoch's end offsets are in Spark's offset log, nothing read yet",
    "sink.mid_produce": "task: some of the slot's records are produced into its open transaction",
    "sink.after_precommit": "task: the transaction is flushed with its ledger record; the vote is not sent",
    "sink.after_agreement": "task: the decision is commit; the transaction is not committed yet",
    "sink.between_commits": "task: this slot committed, higher slots have not (commits are ordered while armed)",
    "epoch.after_commit": "driver: every slot committed; Spark's commit log is not written yet",
}
ACTIONS = ("kill", "raise", "pause")
# The source's points cannot know the epoch's number: a plan is made before Spark numbers the
# epoch, and a read task is not told it. `epoch=` is refused for them; they fire by `times=`.
# The runner ships them to the source's reader; the protocol's points fire in eos itself.
SOURCE_POINTS = tuple(name for name in POINTS if name.startswith("source."))
PROTOCOL_POINTS = tuple(name for name in POINTS if name not in SOURCE_POINTS)

_SPEC = re.compile(r"^\s*(?P<name>[a-z_.]+)\s*=\s*(?P<action>[a-z]+)(?:\((?P<arg>[0-9.]+)\))?\s*(?:@(?P<cond>.*))?$")


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with `raise`."""


@dataclass(frozen=True)
class Failpoint:
    name: str
    action: str
    arg: float = 0.0
    epoch: int | None = None
    slot: int | None = None
    attempt: int | None = None
    times: int = 1

    def matches(self, epoch: int | None, slot: int | None, attempt: int | None) -> bool:
        return all(
            want is None or want == got
            for want, got in ((self.epoch, epoch), (self.slot, slot), (self.attempt, attempt))
        )

    def spec(self) -> str:
        conds = [f"{k}={v}" for k in ("epoch", "slot", "attempt") if (v := getattr(self, k)) is not None]
        conds.append(f"times={self.times}")
        action = f"{self.action}({self.arg:g})" if self.action == "pause" else self.action
        return f"{self.name}={action}@{','.join(conds)}"


def parse(specs: str | list[str]) -> tuple[Failpoint, ...]:
    items = specs.split(";") if isinstance(specs, str) else specs
    points = []
    for item in items:
        if not item.strip():
            continue
        match = _SPEC.match(item)
        if not match:
            raise ValueError(f"failpoint {item!r}: expected NAME=ACTION[@epoch=N,slot=K,attempt=A,times=T]")
        name, action = match.group("name"), match.group("action")
        if name not in POINTS:
            raise ValueError(f"failpoint {item!r}: unknown point {name!r}; known: {', '.join(POINTS)}")
        if action not in ACTIONS:
            raise ValueError(f"failpoint {item!r}: unknown action {action!r}; known: kill, raise, pause(SECONDS)")
        fields: dict[str, int] = {}
        for cond in filter(None, (c.strip() for c in (match.group("cond") or "").split(","))):
            key, _, value = cond.partition("=")
            if key not in ("epoch", "slot", "attempt", "times") or not value.strip().isdigit():
                raise ValueError(f"failpoint {item!r}: bad condition {cond!r}")
            fields[key] = int(value)
        if "epoch" in fields and name in SOURCE_POINTS:
            raise ValueError(f"failpoint {item!r}: {name} cannot know its epoch; use times=N instead of epoch=N")
        points.append(Failpoint(name, action, float(match.group("arg") or 0), **fields))
    return tuple(points)


@dataclass(frozen=True)
class Failpoints:
    """The armed set; picklable, so the driver ships it to the sink tasks."""

    points: tuple[Failpoint, ...] = ()
    state_dir: str = ""
    driver_pgid: int = 0

    def armed(self, name: str) -> bool:
        return any(p.name == name for p in self.points)

    def hit(self, name: str, epoch: int | None = None, slot: int | None = None, attempt: int | None = None) -> None:
        if not self.points:
            return
        for point in self.points:
            if point.name == name and point.matches(epoch, slot, attempt) and self._consume(point):
                self._act(point, f"{name} (epoch {epoch}, slot {slot}, attempt {attempt})")

    def _consume(self, point: Failpoint) -> bool:
        """Claim one of the point's firings, atomically across processes and restarts."""
        if point.times == 0:
            return True
        folder = Path(self.state_dir or tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9]+", "_", point.spec())
        for n in range(point.times):
            try:
                os.close(os.open(folder / f"{stem}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return True
            except FileExistsError:
                continue
        return False

    def _act(self, point: Failpoint, where: str) -> None:
        if point.action == "pause":
            # A test can end every pause early: a stall that must outlast something it cannot
            # time (another driver's whole run on a loaded machine) is released instead.
            released = Path(self.state_dir or tempfile.gettempdir()) / RELEASE
            deadline = time.monotonic() + point.arg
            while time.monotonic() < deadline and not released.exists():
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        elif point.action == "raise":
            raise FailpointError(f"failpoint {where}")
        elif point.action == "kill":
            print(f"eos failpoint: kill -9 at {where}", flush=True)
            if self.driver_pgid and os.getpgid(0) != self.driver_pgid:
                # In a Python worker our stdout reaches the user through the Spark JVM: give it a
                # moment to forward the line before the kill takes the JVM down.
                time.sleep(0.5)
            # The driver's group holds the driver and the Spark JVM; PySpark's worker daemon
            # puts itself and the Python workers in a group of their own.
            # The driver first: killing our own group first would kill us before we got to it.
            for group in dict.fromkeys([self.driver_pgid, os.getpgid(0)]):
                if group:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


DISARMED = Failpoints()
RELEASE = "RELEASE"


def release(state_dir: str | Path) -> None:
    """End every pause of failpoints using `state_dir` (tests)."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RELEASE).touch()


def from_specs(specs: list[str], state_dir: str) -> Failpoints:
    """The armed set from config plus EOS_FAILPOINTS. A `kill` point makes this process the
    leader of a new process group, so the kill takes the JVM and Python workers with it (and
    never the parent that started eos)."""
    points = parse(specs) + parse(os.environ.get("EOS_FAILPOINTS", ""))
    if not points:
        return DISARMED
    pgid = 0
    if any(p.action == "kill" for p in points):
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
        pgid = os.getpgid(0)
    return Failpoints(points, state_dir, pgid)

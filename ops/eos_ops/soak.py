"""`eos soak`: a long randomized fault schedule against a real pipeline, then proof.

On its own local broker it runs one pipeline with two sinks fed by the same source: a keyed
copy (every input id exactly once) and a stateful aggregate (counts per group per 10-second
event-time window). Input arrives in chunks; every chunk is processed by `eos run` processes
that are crashed or disturbed by a fault drawn at random (kind, protocol point, epoch, timing):

  kill            kill -9 of the driver's process group at a random protocol point and epoch
  raise           a task or driver failure at a random point (the epoch is retried)
  stall           a slot stalls past the epoch timeout (its attempt is aborted, a new one runs)
  read-failure    a source read task fails (Spark retries it)
  broker-kill     kill -9 of the broker at a random moment, then restart it
  broker-restart  clean broker restart at a random moment
  long-outage     crash after pre-commit and stay down past transaction.timeout.ms
  none            no fault

At the end, `eos verify` logic checks both sinks against the input and prints the table.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eos.failpoints import PROTOCOL_POINTS
from eos.protocol.checkpoint import Checkpoint
from eos_connectors.kafka.clients import admin_client, create_topic, producer
from eos_ops.verify import Aggregate, Decoder, Match, VerifySpec, verify

TXN_TIMEOUT_MS = 10_000
MAX_PER_EPOCH = 20_000
BASE_MS = 1_767_225_600_000


def _say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class SoakResult:
    records_in: int = 0
    runs: int = 0
    epochs: int = 0
    planned: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)  # faults that really happened
    points: Counter[str] = field(default_factory=Counter)
    copy: Any = None  # VerifyReport of the keyed copy
    windows: Any = None  # VerifyReport of the aggregate
    seconds: float = 0.0

    def table(self) -> str:
        rows = [
            ("records in", f"{self.records_in:,}"),
            ("eos run processes", str(self.runs)),
            ("epochs committed", str(self.epochs)),
            *[(f"faults injected: {kind}", f"{self.faults[kind]} (of {n} scheduled)")
              for kind, n in sorted(self.planned.items())],
            *[(f"  kill/raise at {point}", str(n)) for point, n in sorted(self.points.items())],
            ("copy sink: records out", f"{self.copy.output_records:,}"),
            ("copy sink: lost / duplicated / unexpected",
             f"{len(self.copy.lost)} / {len(self.copy.duplicated)} / {len(self.copy.unexpected)}"),
            ("copy sink: aborted records seen (read_uncommitted)", f"{self.copy.aborted_seen:,}"),
            ("window sink: windows out (expected)", f"{self.windows.output_records:,} ({self.windows.expected:,})"),
            ("window sink: lost / duplicated / unexpected / wrong",
             f"{len(self.windows.lost)} / {len(self.windows.duplicated)} / {len(self.windows.unexpected)} / "
             f"{len(self.windows.wrong)}"),
            ("window sink: aborted records seen (read_uncommitted)", f"{self.windows.aborted_seen:,}"),
            ("wall time", f"{self.seconds / 60:.1f} min"),
            ("result", "EXACTLY ONCE" if self.copy.ok and self.windows.ok else "FAILED"),
        ]  # fmt: skip
        width = max(len(k) for k, _ in rows)
        lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
        return "\n".join(lines)


class Soak:
    def __init__(self, records: int, chunk: int, seed: int, workdir: Path, heap: str = "768m"):
        from eos_ops.localkafka import LocalBroker, free_port

        self.records, self.chunk, self.rng = records, chunk, random.Random(seed)
        self.workdir = workdir
        self.broker = LocalBroker(port=free_port(), data_dir=workdir / "broker", heap=heap)
        self.result = SoakResult()
        self.produced = 0
        self.name = f"soak-{seed}"

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    # -- set-up ----------------------------------------------------------------------------------
    def setup(self) -> Path:
        self.broker.start(progress=_say)
        admin = admin_client({"bootstrap.servers": self.bootstrap})
        for topic, partitions in (("soak-in", 4), ("soak-copy", 2), ("soak-windows", 2)):
            create_topic(admin, topic, partitions)
        pipeline = {
            "name": self.name,
            "checkpoint": str(self.workdir / "checkpoint"),
            "epochs": {"trigger": "available-now", "slots": 2, "timeout": "20s", "tolerable_failures": 6},
            "sources": [{
                "name": "events",
                "kafka": {"bootstrap": self.bootstrap, "topics": ["soak-in"], "max_records_per_epoch": MAX_PER_EPOCH},
                "value_format": {"type": "json", "schema": "tick.avsc"},
                "watermark": {"column": "ts", "delay": "30 seconds"},
            }],
            "transforms": [{
                "name": "windows",
                "sql": "SELECT grp, window.start AS window_start, count(*) AS n FROM events "
                       "GROUP BY grp, window(ts, '10 seconds')",
            }],
            "sinks": [
                {"name": "copy", "input": "events", "kafka": {"bootstrap": self.bootstrap, "topic": "soak-copy",
                 "config": {"transaction.timeout.ms": TXN_TIMEOUT_MS}}, "key": "grp",
                 "value": "to_json(named_struct('id', id, 'grp', grp))", "value_format": "string"},
                {"name": "windows", "input": "windows", "kafka": {"bootstrap": self.bootstrap,
                 "topic": "soak-windows", "config": {"transaction.timeout.ms": TXN_TIMEOUT_MS}},
                 "key": "grp", "value_format": "json"},
            ],
        }  # fmt: skip
        path = self.workdir / "pipeline.yaml"
        path.write_text(json.dumps(pipeline, indent=2))
        return path

    def produce(self, count: int, closer: bool = False) -> None:
        out = producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 20})
        for i in range(self.produced, self.produced + count):
            event = {"id": f"e{i}", "grp": f"g{i % 7}", "ts": BASE_MS + i * 10}
            while True:
                try:
                    # Keyed by id, so every partition carries an even share of each stretch of
                    # event time: fair admission then keeps the partitions' event times together,
                    # and the watermark never overtakes a lagging partition (see docs).
                    out.produce("soak-in", _json(event), event["id"].encode())
                    break
                except BufferError:
                    out.poll(0.1)
        self.produced += count
        if closer:  # its event time is far past the last record's: it closes every earlier window
            end = {"id": "closer", "grp": "end", "ts": BASE_MS + self.produced * 10 + 600_000}
            out.produce("soak-in", _json(end), b"closer")
        out.flush(120)

    # -- one run with one fault -------------------------------------------------------------------
    def _target_epoch(self) -> int:
        """An epoch this run will reach: the replayed one (a crash during recovery), or one of
        the chunk's new epochs."""
        checkpoint = Checkpoint(str(self.workdir / "checkpoint"))
        first = checkpoint.pending_replay()
        if first is None:
            logged = checkpoint.last_logged_epoch()
            first = 0 if logged is None else logged + 1
        return first + self.rng.randrange(0, max(1, self.chunk // MAX_PER_EPOCH))

    def run_once(self, path: Path, fault: str, point: str = "") -> tuple[int, bool]:
        """One `eos run` over what is pending, disturbed by `fault` (at `point` for kill and
        raise). Counts the fault only if it really happened (a failpoint's firing record, or the
        broker bounced mid-run). Returns the run's exit code and whether the fault happened."""
        epoch = self._target_epoch()
        args = ["run", str(path), "-q"]
        fired_dir = self.workdir / "checkpoint" / "_eos" / "scratch" / "failpoints"
        # Failpoints fire `times` times across restarts; every soak run arms a fresh one.
        shutil.rmtree(fired_dir, ignore_errors=True)
        if fault in ("kill", "raise"):
            slot = f",slot={self.rng.randrange(2)}" if point.startswith("sink.") else ""
            args += ["--failpoint", f"{point}={fault}@epoch={epoch}{slot}"]
        elif fault == "stall":
            args += ["--failpoint", f"sink.after_agreement=pause(30)@epoch={epoch},slot={self.rng.randrange(2)}"]
        elif fault == "read-failure":
            args += ["--master", "local[2,3]", "--failpoint", "source.read=raise@times=1"]
        elif fault == "long-outage":
            args += ["--failpoint", f"sink.after_precommit=kill@epoch={epoch}"]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        proc = subprocess.Popen([sys.executable, "-m", "eos", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)  # fmt: skip
        bounced: list[bool] = []
        disturb = None
        if fault in ("broker-kill", "broker-restart"):
            disturb = threading.Timer(
                self.rng.uniform(3, 15), self._bounce_broker, args=(fault == "broker-kill", proc, bounced)
            )
            disturb.start()
        try:
            _, err = proc.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        if disturb:
            disturb.cancel()
            disturb.join()
        self.result.runs += 1
        fired = bool(bounced) or (fired_dir.is_dir() and any(fired_dir.iterdir()))
        if fault != "none":
            self.result.planned[fault] += 1
            if fired:
                self.result.faults[fault] += 1
                if point:
                    self.result.points[f"{point} ({fault})"] += 1
        what = "" if fault == "none" else f"; fault {fault} {'fired' if fired else 'not reached (tried again later)'}"
        _say(f"  run {self.result.runs}: exit {proc.returncode}{what}")
        if proc.returncode not in (0, -signal.SIGKILL) and err:
            _say("  its last words: " + " | ".join(err.strip().splitlines()[-3:])[:400])
        if fault == "long-outage" and fired:
            _say(f"  down for {TXN_TIMEOUT_MS / 1000 + 5:.0f} s: past transaction.timeout.ms")
            time.sleep(TXN_TIMEOUT_MS / 1000 + 5)
        return proc.returncode, fired

    def _bounce_broker(self, kill: bool, proc: subprocess.Popen, bounced: list[bool]) -> None:
        if proc.poll() is not None:
            return  # the run ended first: nothing to disturb
        _say(f"  {'kill -9' if kill else 'clean restart'} of the broker")
        self.broker.stop(kill=kill)
        bounced.append(True)
        time.sleep(self.rng.uniform(1, 6))
        self.broker.start()

    def drain(self, path: Path) -> None:
        for _ in range(10):
            if self.run_once(path, "none")[0] == 0:
                return
        raise RuntimeError("the pipeline did not finish after the faults")

    # -- the schedule -----------------------------------------------------------------------------
    def _deck(self) -> list[tuple[str, str]]:
        """One round of faults in random order: a kill -9 at every protocol point, two raises at
        random points, and one of each other kind. Drawing from rounds (instead of picking each
        fault independently) puts a fault at every point even in a short soak."""
        deck = [("kill", point) for point in PROTOCOL_POINTS]
        deck += [("raise", self.rng.choice(PROTOCOL_POINTS)) for _ in range(2)]
        deck += [(kind, "") for kind in ("stall", "read-failure", "broker-kill", "broker-restart", "long-outage",
                                         "none")]  # fmt: skip
        self.rng.shuffle(deck)
        return deck

    def run(self) -> SoakResult:
        started = time.monotonic()
        path = self.setup()
        deck: list[tuple[str, str]] = []
        while self.produced < self.records:
            self.produce(min(self.chunk, self.records - self.produced))
            if not deck:
                deck = self._deck()
            fault, point = deck.pop()
            _say(f"{self.produced:,}/{self.records:,} records in; run with fault: {fault} {point}".rstrip())
            _, fired = self.run_once(path, fault, point)
            if fault != "none" and not fired:
                deck.insert(0, (fault, point))  # not reached in this run: try it again later
        self.produce(0, closer=True)
        self.drain(path)
        self.result.records_in = self.produced + 1
        self.result.epochs = (Checkpoint(str(self.workdir / "checkpoint")).last_committed_epoch() or 0) + 1
        _say("verifying both sinks against the input ...")
        self.result.copy = verify(VerifySpec(
            self.bootstrap, "soak-in", "soak-copy", Decoder("json"), Decoder("json"),
            match=Match("id", "id"),
        ))  # fmt: skip
        self.result.windows = verify(VerifySpec(
            self.bootstrap, "soak-in", "soak-windows", Decoder("json"), Decoder("json"),
            aggregate=Aggregate(group_by={"grp": "grp", "window_start": {"field": "ts", "window": "10s"}},
                                values={"n": "count"}, watermark_delay="30s"),
        ))  # fmt: skip
        self.result.seconds = time.monotonic() - started
        return self.result

    def close(self) -> None:
        self.broker.stop()


def _json(event: dict[str, Any]) -> bytes:
    ts = event["ts"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts / 1000)) + f".{ts % 1000:03d}Z"
    return json.dumps({**event, "ts": iso}).encode()


SOAK_DOC = """\
A private local broker; one pipeline with two sinks fed by one source: a keyed copy (every input id
exactly once) and a windowed count per group (10-second event-time windows, 30 s watermark). Input
arrives in chunks of `--chunk` records; each chunk is processed by an `eos run` process disturbed by
one fault, drawn from shuffled rounds that hold a kill -9 at every protocol point, two failures at
random points, a stalled slot, a failed read task, a broker kill -9, a clean broker restart, an outage
past `transaction.timeout.ms` (10 s here) and a run without fault. A fault counts as injected only if
it really happened (its failpoint fired, or the broker went down while the run was up); one that the
run did not reach is tried again later. Then the pipeline runs to the end undisturbed, and both sinks
are checked against the input with `eos verify`'s logic, reading `read_committed`; the aborted records
a `read_uncommitted` reader sees show that the faults cut real transactions.

Run it yourself (about 20 minutes on 2 cores; it needs nothing running):

```sh
.venv/bin/eos soak --records 1000000 --chunk 40000 --seed 1 --output docs/SOAK.md
```
"""


def run_soak(records: int, chunk: int, seed: int, keep: bool, output: Path | None) -> int:
    from eos.paths import eos_home

    workdir = Path(tempfile.mkdtemp(prefix="soak-", dir=eos_home()))
    soak = Soak(records, chunk, seed, workdir)
    try:
        result = soak.run()
    finally:
        soak.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    table = result.table()
    print(table)
    if output is not None:
        output.write_text(
            f"# Soak run\n\n`eos soak --records {records} --chunk {chunk} --seed {seed}`, on "
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores.\n\n{SOAK_DOC}\n{table}\n"
        )
    return 0 if result.copy.ok and result.windows.ok else 1

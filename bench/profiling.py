"""Sampling profiles of the driver and Spark's Python workers with py-spy, and what they say.

`py-spy record --format raw` writes collapsed stacks ("frame;frame;... count"); the summary
gives, per process group, the functions where samples land (self) and the functions that
contain them (inclusive), and sorts the workers' samples into the pipeline's steps by the
innermost eos/connector function on the stack. Samples whose innermost frame is a known wait
(`IDLE`) are dropped. Only on-CPU samples are kept (py-spy's default
drops idle threads), so the shares are shares of CPU time spent in Python.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

from bench.env import py_spy

# Innermost match wins: a sample inside encode_batch called from a worker loop is "Avro encode".
STEPS: tuple[tuple[str, str], ...] = (
    ("sink: transactional id lease + init_transactions", "_lease"),
    ("commit thread: vote, wait for the decision, commit_transaction", "_await_and_commit"),
    ("sink pre-commit: ledger record + flush (wait for acks)", "precommit"),
    ("sink produce (Arrow -> librdkafka)", "produce_pairs"),
    ("sink produce (Arrow -> librdkafka)", "produce_rows"),
    ("Avro encode (fastavro, in the sink writer)", "encode_batch"),
    ("Avro decode (fastavro, in the read task)", "decode_batch"),
    ("source read: Kafka consume", "read_range"),
    ("source read: Arrow batch building", "to_arrow"),
    ("slot: splitting the rows by sink, struct -> batch", "write_slot"),
    ("raw loop: Avro decode", "schemaless_reader"),
    ("raw loop: transform + encode", "process"),
    ("raw loop: consume", "consume"),
    ("PySpark: new worker set-up (sys.path, import caches)", "setup_spark_files"),
    ("PySpark: new worker start-up (imports)", "import_module"),
    ("Python imports (a new worker loading eos, pyarrow, confluent_kafka ...)", "_find_and_load"),
    ("PySpark: unpickling the task's functions", "read_udfs"),
    ("PySpark: Arrow to/from the JVM", "dump_stream"),
    ("PySpark: Arrow to/from the JVM", "load_stream"),
    ("PySpark daemon/worker loop", "manager"),
)
_LINE = re.compile(r":\d+\)$")


class Recorder:
    """py-spy attached to some processes until stop() (SIGINT makes it write its file)."""

    def __init__(self, out_dir: Path, rate: int = 50):
        self.out_dir, self.rate = out_dir, rate
        self.procs: list[tuple[str, Path, subprocess.Popen]] = []

    def attach(self, label: str, pid: int, subprocesses: bool = False) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{label}-{pid}.txt"
        cmd = [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(self.rate),
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ]
        if subprocesses:
            cmd.append("--subprocesses")
        log = open(self.out_dir / f"{label}-{pid}.log", "w")  # noqa: SIM115 (closed with the process)
        self.procs.append((label, out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))

    def stop(self) -> dict[str, list[Path]]:
        for _, _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        files: dict[str, list[Path]] = {}
        for label, out, proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if out.exists():
                files.setdefault(label, []).append(out)
        self.procs = []
        return files


def _frames(stack: str) -> list[str]:
    frames = []
    for frame in stack.split(";"):
        if frame.startswith("process "):
            # py-spy's process pseudo-frame: 'process 123:"python -m pyspark.daemon pyspark.worker"'
            frames.append("[" + frame.split(":", 1)[-1].strip('"').split(" -m ")[-1] + "]")
            continue
        if frame.startswith("thread "):
            continue
        name = _LINE.sub(")", frame.strip())
        # "func (/long/path/to/module.py)" -> "func (to/module.py)"
        match = re.match(r"^(.*) \((.*)\)$", name)
        if match:
            path = "/".join(Path(match.group(2)).parts[-2:])
            name = f"{match.group(1)} ({path})"
        frames.append(name)
    return frames


def read_stacks(files: list[Path]) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stacks[tuple(_frames(stack))] += int(count)
    return stacks


# Innermost frames that are waiting, not computing: with `--nonblocking` py-spy cannot always tell
# a thread blocked in a C call from a running one, so these samples are dropped (the PySpark
# daemon's 1 s poll() loop alone made up most of the workers' samples).
IDLE = (
    "manager (daemon.py)",
    "SocketIO.readinto (socket.py)",
    "_PollLikeSelector.select (selectors.py)",
    "Condition.wait (threading.py)",
    "FinalizerWorker.run (py4j/clientserver.py)",
    "read_int (serializers.py)",
    "Event.wait (threading.py)",
)


def summarize(files: list[Path], top: int = 12) -> dict[str, object]:
    stacks = read_stacks(files)

    def idle(frames: tuple[str, ...]) -> bool:
        code = [f for f in frames if not f.startswith("[")]
        return bool(code) and code[-1] in IDLE

    idle_samples = sum(n for frames, n in stacks.items() if idle(frames))
    stacks = Counter({frames: n for frames, n in stacks.items() if not idle(frames)})
    total = sum(stacks.values())
    if not total:
        return {"samples": 0, "idle_samples": idle_samples, "self": [], "inclusive": [], "steps": []}
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for frames, count in stacks.items():
        process = [f for f in frames if f.startswith("[")]
        kinds[process[-1] if process else "[this process]"] += count
        frames = tuple(f for f in frames if not f.startswith("["))
        if frames:
            own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
        steps[_step(frames)] += count

    def pct(counter: Counter[str], limit: int, skip_roots: bool = False) -> list[tuple[str, float]]:
        rows = [(name, 100.0 * n / total) for name, n in counter.most_common()]
        if skip_roots:  # frames on (nearly) every stack say nothing
            rows = [(name, share) for name, share in rows if share < 97.0]
        return [(name, round(share, 1)) for name, share in rows[:limit]]

    return {
        "samples": total,
        "idle_samples": idle_samples,
        "self": pct(own, top),
        "inclusive": pct(inclusive, top, skip_roots=True),
        "steps": pct(steps, len(STEPS) + 1),
        "processes": pct(kinds, 10),
    }


def _step(frames: tuple[str, ...] | list[str]) -> str:
    for frame in reversed(frames):
        function = frame.split(" (", 1)[0]
        for label, name in STEPS:
            if function == name:
                return label
    return "other (PySpark worker loop, serialization, imports)"

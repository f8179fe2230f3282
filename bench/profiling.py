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


# ---------------------------------------------------------------------------------------------
# The Spark JVM: Java Flight Recorder (in the JDK), execution samples of Java threads
# ---------------------------------------------------------------------------------------------

# Innermost match wins, so the specific contexts come first in the stack walk: a row written by
# generated code inside Spark's Kafka writer is "Kafka producer", inside the Python runner's
# writer "data to/from Python workers".
JVM_STEPS: tuple[tuple[str, str], ...] = (
    ("class and resource loading (jar lookups)", "java.util.zip."),
    ("class and resource loading (jar lookups)", "java.lang.ClassLoader"),
    ("Kafka producer (Spark's sink)", "org.apache.kafka.clients.producer"),
    ("Kafka producer (Spark's sink)", "org.apache.spark.sql.kafka010.KafkaRowWriter"),
    ("Kafka producer (Spark's sink)", "org.apache.spark.sql.kafka010.KafkaDataWriter"),
    ("Kafka consumer (Spark's source)", "org.apache.kafka.clients.consumer"),
    ("Kafka consumer (Spark's source)", "org.apache.spark.sql.kafka010"),
    ("state store (RocksDB)", ".streaming.state."),
    ("shuffle (aggregation)", "org.apache.spark.shuffle"),
    ("shuffle (aggregation)", "ShuffleBlockFetcherIterator"),
    ("shuffle (aggregation)", "org.apache.spark.storage"),
    ("data to/from Python workers (Arrow)", "org.apache.spark.sql.execution.python"),
    ("data to/from Python workers (Arrow)", "org.apache.spark.api.python"),
    ("data to/from Python workers (Arrow)", "org.apache.spark.sql.execution.arrow"),
    ("data to/from Python workers (Arrow)", "org.apache.arrow"),
    ("checkpoint: offset and commit logs", "MetadataLog"),
    ("checkpoint: offset and commit logs", "CheckpointFileManager"),
    ("listener bus (progress events, to Python listeners too)", "org.apache.spark.scheduler.AsyncEventQueue"),
    ("listener bus (progress events, to Python listeners too)", "ListenerBus"),
    ("query planning, analysis, code generation", "org.apache.spark.sql.catalyst.rules"),
    ("query planning, analysis, code generation", "org.apache.spark.sql.execution.QueryExecution"),
    ("query planning, analysis, code generation", "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator"),
    ("query planning, analysis, code generation", "org.codehaus.janino"),
    ("query planning, analysis, code generation", "IncrementalExecution"),
    ("task scheduling and RPC", "org.apache.spark.scheduler"),
    ("task scheduling and RPC", "org.apache.spark.rpc"),
    ("py4j (calls from the Python driver)", "py4j."),
    ("streaming engine (micro-batch loop)", "org.apache.spark.sql.execution.streaming"),
    ("task execution (rows, generated code)", "org.apache.spark.executor.Executor"),
)


class JvmRecorder:
    """JFR on a running JVM (jcmd JFR.start / JFR.stop), then its execution samples."""

    def __init__(self, out: Path, pid: int):
        self.out, self.pid = out, pid

    def start(self) -> bool:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["jcmd", str(self.pid), "JFR.start", "name=bench", "settings=profile", f"filename={self.out}"]
        return subprocess.run(cmd, capture_output=True, text=True).returncode == 0

    def stop(self) -> Path | None:
        subprocess.run(["jcmd", str(self.pid), "JFR.stop", "name=bench"], capture_output=True, text=True)
        return self.out if self.out.exists() else None


def jvm_summary(jfr_file: Path, top: int = 12) -> dict[str, object]:
    """Execution samples by thread kind, by step (innermost matching frame), and top frames."""
    text = subprocess.run(
        ["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(jfr_file)],
        capture_output=True,
        text=True,
    ).stdout
    threads: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for event in text.split("jdk.ExecutionSample")[1:]:
        thread = re.search(r'sampledThread = "([^"]*)"', event)
        frames = re.findall(r"^\s+([\w$.<>/]+)\(", event, re.MULTILINE)  # innermost first
        if not frames:
            continue
        total += 1
        name = re.sub(r"\d+", "N", thread.group(1)) if thread else "?"
        threads[name] += 1
        own[frames[0]] += 1
        for frame in frames:
            label = next((label for label, prefix in JVM_STEPS if prefix in frame), None)
            if label:
                steps[label] += 1
                break
        else:
            steps["other Java"] += 1

    def pct(counter: Counter[str], limit: int) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 1)) for k, v in counter.most_common(limit)]

    return {"samples": total, "threads": pct(threads, 8), "steps": pct(steps, 20), "self": pct(own, top)}

"""CPU profiles of the Spark JVM with async-profiler, and what they say.

Why async-profiler and not Java Flight Recorder: JFR samples Java frames only. A thread inside
native code (RocksDB's JNI calls, zlib, the JVM's own JIT compilers and garbage collector) is
invisible to its execution samples, so a JFR profile put RocksDB at 0.5% of a stateful run whose
JVM spent 38% of its CPU in RocksDB's native code (bench/NOTES.md, 2026-11-27). async-profiler's
`itimer` mode samples every thread by the CPU time it uses, Java, native and JVM frames alike, with
no kernel settings (perf events often are not allowed).

The profiler is a native library (tools.profiler:async-profiler on Maven Central, the jar of this
machine's platform: bench/maven/async-profiler.xml), fetched once into $EOS_HOME with
eos_ops.jvm.fetch_jars like the benchmark's other jars, and loaded into
the running JVM with `jcmd PID JVMTI.agent_load`; its samples come back as collapsed stacks, one
line per distinct stack ("[thread tid=N];frame;...;frame count").
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

from eos.paths import eos_home
from eos_ops.jvm import fetch_jars

VERSION = "4.2"
MAVEN_DIR = Path(__file__).resolve().parent / "maven"
PLATFORMS = {"x86_64": "linux-x64", "amd64": "linux-x64", "aarch64": "linux-arm64", "arm64": "linux-arm64"}


def library(say) -> tuple[Path | None, str]:
    """The profiler's native library for this machine, fetched once; or None and why not."""
    arch = PLATFORMS.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or arch is None:
        return None, f"async-profiler has no build for {sys.platform}/{platform.machine()}"
    found = eos_home() / "bench" / "async-profiler" / VERSION / arch / "libasyncProfiler.so"
    if found.is_file():
        return found, ""
    libs, why = fetch_jars(
        MAVEN_DIR / "async-profiler.xml",
        found.parent.parent,
        f"async-profiler {VERSION} ({arch})",
        say,
        properties={"profiler.version": VERSION, "profiler.platform": arch},
        key=arch,
        settings=MAVEN_DIR / "settings.xml",
        optional=True,
    )
    if libs is None:
        return None, why
    member = f"{arch}/libasyncProfiler.so"
    try:
        for jar in libs.glob("async-profiler-*.jar"):
            with zipfile.ZipFile(jar) as archive:
                if member in archive.namelist():
                    staged = Path(tempfile.mkdtemp(prefix="lib-", dir=found.parent))
                    archive.extract(member, staged)
                    (staged / member).replace(found)  # in place whole, or not at all
                    shutil.rmtree(staged, ignore_errors=True)
                    return found, ""
    except (OSError, zipfile.BadZipFile) as exc:
        return None, f"could not take the library out of async-profiler's jar: {exc}"
    return None, f"no async-profiler jar in {libs} holds {member}"


class JvmRecorder:
    """async-profiler in a running JVM between start() and stop(): CPU samples of every thread
    (`itimer`, every `interval_ms` of CPU time), written as collapsed stacks by thread."""

    def __init__(self, library: Path, out: Path, pid: int, interval_ms: int = 5):
        self.library, self.out, self.pid, self.interval_ms = library, out, pid, interval_ms

    def _agent(self, options: str) -> bool:
        # jcmd splits its own arguments on '=' unless the agent's options are quoted.
        cmd = ["jcmd", str(self.pid), "JVMTI.agent_load", str(self.library), f'"{options}"']
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        return result.returncode == 0 and "return code: 0" in result.stdout

    def start(self) -> bool:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        return self._agent(f"start,event=itimer,interval={self.interval_ms}ms,threads")

    def stop(self) -> Path | None:
        self._agent(f"stop,file={self.out},collapsed")
        return self.out if self.out.is_file() and self.out.stat().st_size else None


# Threads whose whole CPU is the JVM's own work, by name (their stacks are HotSpot internals).
# The JVM's own threads are named by the OS, in at most 15 characters ("C2 CompilerThre").
JVM_THREADS: tuple[tuple[str, str], ...] = (
    ("JIT compiler", r"^C[12] Compiler"),
    ("garbage collection", r"^(G1 |GC Thread|VM Thread|VM Periodic)"),
)

# For every other thread the innermost matching frame decides, so the specific contexts come
# first in the stack walk: a row written by generated code inside Spark's Kafka writer is "Kafka
# producer", inside the Python runner's writer "data to/from Python workers". Java frames are
# matched with dots (async-profiler writes them with slashes); native ones as they are.
JVM_STEPS: tuple[tuple[str, str], ...] = (
    ("class and resource loading (jar lookups)", "java.util.zip."),
    ("class and resource loading (jar lookups)", "java.lang.ClassLoader"),
    ("Kafka producer (Spark's sink)", "org.apache.kafka.clients.producer"),
    ("Kafka producer (Spark's sink)", "org.apache.spark.sql.kafka010.KafkaRowWriter"),
    ("Kafka producer (Spark's sink)", "org.apache.spark.sql.kafka010.KafkaDataWriter"),
    ("Kafka consumer (Spark's source)", "org.apache.kafka.clients.consumer"),
    ("Kafka consumer (Spark's source)", "org.apache.spark.sql.kafka010"),
    ("state store", "rocksdb::"),
    ("state store", "org.rocksdb."),
    ("state store", ".streaming.state."),
    ("compression (shuffle and state files)", "LZ4"),
    ("compression (shuffle and state files)", "net.jpountz."),
    ("compression (shuffle and state files)", "libz.so"),
    ("compression (shuffle and state files)", "zstd"),
    ("shuffle", "org.apache.spark.shuffle"),
    ("shuffle", "ShuffleBlockFetcherIterator"),
    ("shuffle", "org.apache.spark.storage"),
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
_THREAD = re.compile(r"^\[(.*?)(?: tid=\d+)?\]$")


def thread_kind(thread: str) -> str:
    """A thread's name with what differs between runs folded: numbers to N, and a query's name and
    ids out of its stream execution thread's (its hex ids would make a row per run)."""
    if thread.startswith("stream execution thread for "):
        return "stream execution thread (the query's)"
    return re.sub(r"\d+", "N", thread)


def jvm_step(thread: str, frames: list[str]) -> str:
    """What a sample of `thread` with `frames` (outermost first) was doing."""
    for label, pattern in JVM_THREADS:
        if re.search(pattern, thread):
            return label
    for frame in reversed(frames):
        name = frame.replace("/", ".")
        label = next((label for label, part in JVM_STEPS if part in name), None)
        if label:
            return label
    return "other (JVM runtime, Java)"


def jvm_summary(collapsed: Path, top: int = 12) -> dict[str, object]:
    """CPU samples by thread (numbers folded to N), by step, and the top frames by self time."""
    threads: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        thread = match.group(1) if match else "?"
        if match:
            frames = frames[1:]
        if not frames:
            continue
        n = int(count)
        threads[thread_kind(thread)] += n
        steps[jvm_step(thread, frames)] += n
        own[frames[-1].replace("/", ".")] += n
    total = sum(threads.values())
    if not total:
        return {"samples": 0, "threads": [], "steps": [], "self": []}

    def pct(counter: Counter[str], limit: int) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 1)) for k, v in counter.most_common(limit)]

    return {"samples": total, "threads": pct(threads, 8), "steps": pct(steps, 24), "self": pct(own, top)}

"""Peer baselines: the benchmark's pipelines written with the stream processors an eos user would
otherwise pick, exactly-once, run on the same broker and input as eos in the same benchmark run.

- **Quix Streams** (`run_quix`, bench/peers/quix_app.py): Python, `processing_guarantee=
  "exactly-once"` (one Kafka transaction per checkpoint, Quix's default `commit_interval` of 5 s).
- **Kafka Streams** (`run_kstreams`, bench/peers/kstreams/): Java, `processing.guarantee=
  exactly_once_v2` (one transaction per stream thread per commit, Kafka Streams' default
  `commit.interval.ms` under exactly-once: 100 ms).

Both do the same work as eos: Avro decode of schemas/ad_event.avsc, the pipeline's filter and
projection (or the demo's dedup and windowed counts), Avro encode, produce keyed by event_id
(campaign|minute for the stateful pipeline), read_committed input, all output in transactions with
the input offsets. What is not identical, and why:

- Avro: both peers read and write plain schemaless Avro, as the input is written (no Schema Registry
  framing). Quix uses its own AvroDeserializer/AvroSerializer without a registry (fastavro's
  schemaless reader and writer, timestamp-millis as datetime). Kafka Streams uses a small Serde
  over Avro's GenericDatumReader/Writer (Confluent's GenericAvroSerde needs a registry); the
  timestamp stays a long.
- Parallelism, on this 2-core machine and the 4-partition input. Quix: ONE process by default
  (`processes=1`). A Quix application is a single-threaded Python loop (poll, deserialize, process,
  serialize, produce); its users scale out by starting more processes in one consumer group, but
  here the second core is already the broker's and librdkafka's (its I/O and compression threads),
  one process is what the raw confluent-kafka loop baseline is, and in paired runs on this machine
  two processes were not reliably faster. `processes=2` (partitions split 2+2 in one group) gives
  that row; the stateful pipeline runs in one process. Kafka Streams: one JVM with
  `num.stream.threads=2` by default, one stream thread per core (4 tasks over 2 threads), heap
  512 MiB. In the same paired runs one thread was often faster (each stream thread has its own
  transactional producer committing every 100 ms, and two threads compete with the broker for the
  two cores); `threads=1` gives that row.
- Stateful (the demo): dedup is a stateful step keyed by event_id (the input's key, so duplicates
  share a partition), remembering an id while it is within the watermark (Kafka Streams: a window
  store with 2 minutes' retention; Quix: state with an event-time TTL of 1 minute); an event older
  than the watermark is dropped first, as Spark does; the counts go through a repartition by
  campaign into 1-minute tumbling windows with 1 minute of grace, each emitted once when it closes
  (Kafka Streams: suppress until the window closes; Quix: .final(closing_strategy="partition")). The
  heartbeat reaches every partition of the repartition topic (Kafka Streams: a multicasting
  StreamPartitioner; Quix: one heartbeat per campaign) so that it closes the last windows, as it does
  in Spark. The difference that remains: both keep event time per partition (Kafka Streams per
  task), where Spark keeps one watermark per query, advanced between micro-batches that take every
  partition's offsets in step. On a backlog read as fast as possible, partitions advance unevenly
  (a consumer hands out a fetch's worth of one partition, up to 1 MiB of compressed batches, before
  the next: in the benchmark's 200k-record input that is most of a partition, minutes of event
  time), so a window can close before a lagging partition's events reach it and they are dropped as
  late. Measured there (4 partitions, 185,000 events, 80 windows): Kafka Streams output all 80
  windows but 0 with exact counts, 70,436 events short (16/80 and 92,467 with one stream thread);
  Quix 16/80 exact, 97,203 short; bench/rawloop's stateful loop, whose watermark moves per consumed
  batch, does the same (8/80 exact, 124,568 short). So the stateful peer rows measure the same
  kind of work (decode, dedup state, repartition, windowed state) but not the same result as eos;
  on one input partition both peers output exactly the ground truth
  (tests/integration/test_bench_peers.py). `python -m bench.peers --pipeline stateful --check`
  shows the difference for any input.
- Stopping: eos's benchmark runs end when the input is consumed ("available-now"). Neither peer has
  that mode, so each stops itself once every input partition's end offset (read_committed, taken by
  the runner at start) is processed and committed; see quix_app.StopWhenDone and
  KStreamsPeer.waitUntilCommitted. The last commit is part of the measured time. Stateful: Kafka
  Streams also waits for its repartition topic's committed offsets to reach that topic's end; Quix
  stops once it has output the expected number of windows (`expected_out`), or, should fewer come,
  once the input is processed and nothing has come for two commit intervals + 5 s. On a live input
  (the latency section's) the Kafka Streams peer runs until its standard input closes instead:
  live_kstreams.

Quix Streams runs in a virtualenv of its own (under $EOS_HOME/quix/), not in eos's: each recent
quixstreams release (3.23-3.28 checked) caps confluent-kafka (<2.13) and pydantic (<2.14) below what eos
runs with, and installing it into eos's environment would downgrade the client eos itself is
benchmarked with. The virtualenv gets the same fastavro as eos's, so both decode with the same
code; its confluent-kafka is the newest one quixstreams accepts. Kafka Streams is built once with
Maven into $EOS_HOME/kstreams/<hash of its sources>/ (eos_ops.jvm.fetch_jars, as for the broker's jars).

Every runner returns a dict: wall time (process start to exit, JVM or interpreter start and group
join included) and the processing time (first record to the last commit), input and output records,
rates, CPU seconds of the peer's processes (from their rusage at exit: the whole process, all
threads) and µs of CPU per input record, the broker's CPU over the same span (/proc), and the peer's
peak RSS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import CpuMeter
from eos.errors import EnvironmentProblem
from eos.paths import eos_home, schemas_dir
from eos_ops.jvm import locked

PEERS_DIR = Path(__file__).resolve().parent
BENCH_DIR = PEERS_DIR.parent
QUIX_APP = PEERS_DIR / "quix_app.py"
KSTREAMS_DIR = PEERS_DIR / "kstreams"
KSTREAMS_MAIN = "dev.eos.bench.peers.KStreamsPeer"
QUIXSTREAMS_VERSION = "3.28.1"
KSTREAMS_HEAP = "512m"
VIEW_SCHEMA = BENCH_DIR / "schemas" / "ad_view.avsc"
EVENT_SCHEMA_FILE = "ad_event.avsc"
COUNTS_SCHEMA_FILE = "campaign_counts.avsc"

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Installing the peers (once; cached under $EOS_HOME)
# ---------------------------------------------------------------------------------------------


def _offline(output: str) -> bool:
    return bool(
        re.search(
            r"Could not (transfer|resolve)|UnknownHost|offline|Connection refused|Temporary failure in name resolution"
            r"|No matching distribution|Failed to establish a new connection|NewConnectionError",
            output,
        )
    )


def quix_requirements() -> list[str]:
    import fastavro

    return [f"quixstreams=={QUIXSTREAMS_VERSION}", f"fastavro=={fastavro.__version__}"]


def quix_python(progress: Progress = _quiet) -> str:
    """The Python of Quix Streams' own virtualenv, created once per requirement set.

    $EOS_QUIX_PYTHON overrides it (an interpreter that has quixstreams and fastavro)."""
    if os.environ.get("EOS_QUIX_PYTHON"):
        return os.environ["EOS_QUIX_PYTHON"]
    requirements = quix_requirements()
    digest = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    home = eos_home() / "quix" / digest
    python = home / "venv" / "bin" / "python"
    if (home / ".complete").exists():
        return str(python)
    with locked(eos_home() / "quix" / ".lock"):
        if (home / ".complete").exists():
            return str(python)
        shutil.rmtree(home, ignore_errors=True)  # a half-made one (virtualenvs cannot be moved into place)
        home.mkdir(parents=True)
        progress(f"Installing {' '.join(requirements)} into {home / 'venv'} (once) ...")
        started = time.monotonic()
        base = getattr(sys, "_base_executable", sys.executable)
        steps = [
            [base, "-m", "venv", str(home / "venv")],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        ]
        for cmd in steps:
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                output = (result.stdout + result.stderr).strip()
                shutil.rmtree(home, ignore_errors=True)
                raise EnvironmentProblem(
                    "could not install Quix Streams for the peer baseline"
                    + (" (PyPI unreachable: are you offline?)" if _offline(output) else "")
                    + f".\n  command: {' '.join(cmd)}\n  last lines:\n"
                    + "\n".join("    " + line for line in output.splitlines()[-15:]),
                    hint="check access to PyPI (or a pip index in pip.conf), or set EOS_QUIX_PYTHON to a Python "
                    f"that has {' '.join(requirements)}",
                )
        (home / ".complete").write_text("\n".join(requirements) + "\n")
        progress(f"Installed Quix Streams in {time.monotonic() - started:.1f} s.")
    return str(python)


def kstreams_sources_hash() -> str:
    from eos_ops.localkafka import kafka_version

    digest = hashlib.sha256(kafka_version().encode() + b"\0")
    for path in sorted(p for p in KSTREAMS_DIR.rglob("*") if p.is_file() and "target" not in p.parts):
        digest.update(str(path.relative_to(KSTREAMS_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def kstreams_classpath(progress: Progress = _quiet) -> str:
    """Build the Kafka Streams peer once (Maven: compile, jar, copy its runtime jars beside it, with
    eos_ops.jvm.fetch_jars); returns the Java classpath. Cached by a hash of pom.xml, the sources and
    the broker's Kafka version, which the build uses for kafka-streams (ops/kafka/pom.xml is the one
    place it is written)."""
    from eos_ops.jvm import fetch_jars
    from eos_ops.localkafka import kafka_version

    root = eos_home() / "kstreams"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=root) as build:  # classes: not kept
        libs = fetch_jars(
            KSTREAMS_DIR / "pom.xml",
            root,
            "the Kafka Streams peer",
            progress,
            properties={"kafka.version": kafka_version(), "peer.build.dir": build},
            key=kstreams_sources_hash(),
            goals=("package",),
        )
    return str(libs / "*")


# ---------------------------------------------------------------------------------------------
# Running a peer's processes and measuring them
# ---------------------------------------------------------------------------------------------


@dataclass
class Finished:
    returncode: int
    cpu_s: float  # user + system of the process and the children it waited for
    max_rss_kib: int
    log: Path


def _wait_all(procs: list[tuple[subprocess.Popen, Path]], deadline: float) -> list[Finished]:
    """Reap every process with wait4, for its rusage (its whole CPU, all threads, at exit); SIGTERM
    then SIGKILL whatever is still running at the deadline."""
    pending = {proc.pid: (proc, log) for proc, log in procs}
    done: dict[int, Finished] = {}
    terminated_at: float | None = None
    while pending:
        for pid in list(pending):
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                proc, log = pending.pop(pid)
                proc.returncode = os.waitstatus_to_exitcode(status)
                done[pid] = Finished(proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, log)
        if not pending:
            break
        now = time.monotonic()
        if now > deadline and terminated_at is None:
            terminated_at = now
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        elif terminated_at is not None and now > terminated_at + 30:
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return [done[proc.pid] for proc, _ in procs]


def _tail(path: Path, lines: int = 25) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _input_ends(bootstrap: str, topic: str) -> dict[int, int]:
    from eos_connectors.kafka.clients import admin_client, describe_partitions, end_offsets

    admin = admin_client({"bootstrap.servers": bootstrap})
    partitions = describe_partitions(admin, [topic])
    ends = end_offsets(admin, partitions, read_committed=True)
    return {partition: ends[(topic, partition)] for partition in partitions[topic]}


def _ensure_output(bootstrap: str, topic: str, partitions: int) -> None:
    from eos_connectors.kafka.clients import admin_client, create_topic

    create_topic(admin_client({"bootstrap.servers": bootstrap}), topic, partitions)


def _cleanup(bootstrap: str, group: str, internal_prefixes: tuple[str, ...]) -> None:
    """Drop the run's consumer group and internal topics (changelogs, repartition topics), so later
    runs find the broker as the first did."""
    from bench.inputs import delete_topics
    from eos_connectors.kafka.clients import admin_client

    admin = admin_client({"bootstrap.servers": bootstrap})
    with contextlib.suppress(Exception):  # best effort: leftovers only cost disk
        for future in admin.delete_consumer_groups([group], request_timeout=30).values():
            future.result()
    topics = admin.list_topics(timeout=10).topics
    doomed = [t for t in topics if any(p in t for p in internal_prefixes)]
    if doomed:
        delete_topics(bootstrap, doomed)


def _measure(
    commands: list[list[str]],
    logs: list[Path],
    results: list[Path],
    broker_pid: int | None,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[float, float, list[Finished], list[dict[str, Any]], dict[str, float]]:
    """Start the peer's processes together, wait for all of them; returns (launch wall time,
    wall seconds, each process's end, each process's JSON summary, CpuMeter's classes). A failed
    run raises with the end of its log (the work folder is left for a look)."""
    meter = CpuMeter(os.getpid(), broker_pid)
    meter.start()
    launched = time.time()
    started = time.monotonic()
    procs = []
    for cmd, log in zip(commands, logs, strict=True):
        with open(log, "wb") as out:
            procs.append(
                (
                    subprocess.Popen(
                        cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd
                    ),
                    log,
                )
            )
    finished = _wait_all(procs, started + timeout_s)
    wall = time.monotonic() - started
    cpu = meter.stop()
    summaries = []
    for end, result in zip(finished, results, strict=True):
        if end.returncode != 0 or not result.exists():
            raise RuntimeError(
                f"peer process exited with code {end.returncode}; last lines of {end.log}:\n{_tail(end.log)}"
            )
        summaries.append(json.loads(result.read_text()))
    return launched, wall, finished, summaries, cpu


def _row(
    peer: str,
    pipeline: str,
    records: int,
    launched: float,
    wall: float,
    finished: list[Finished],
    first_record: float | None,
    committed: float | None,
    records_seen: int,
    records_out: int,
    cpu: dict[str, float],
    processing_cpu_s: float | None,
    **extra: Any,
) -> dict[str, Any]:
    cpu_s = sum(f.cpu_s for f in finished)
    broker_s = cpu.get("broker")
    processing = (committed - first_record) if first_record and committed else None
    return {
        "peer": peer,
        "pipeline": pipeline,
        "records_in": records,
        "records_seen": records_seen,
        "records_out": records_out,
        "wall_s": round(wall, 3),
        "rps_wall": records / wall if wall else None,
        "startup_s": round(first_record - launched, 3) if first_record else None,
        "processing_s": round(processing, 3) if processing else None,
        "rps_processing": records / processing if processing else None,
        "cpu_s": round(cpu_s, 2),
        "cpu_us_per_record": cpu_s * 1e6 / records if records else None,
        # The peer's CPU from its first record to its last commit: without interpreter or JVM
        # start-up, imports, class loading and the group join (JIT compilation stays in).
        "processing_cpu_s": round(processing_cpu_s, 2) if processing_cpu_s is not None else None,
        "processing_cpu_us_per_record": processing_cpu_s * 1e6 / records
        if records and processing_cpu_s is not None
        else None,
        "broker_cpu_s": broker_s,
        "broker_cpu_us_per_record": broker_s * 1e6 / records if records and broker_s is not None else None,
        "peer_max_rss_mib": round(max(f.max_rss_kib for f in finished) / 1024, 1),
        "cpu": cpu,
        **extra,
    }


def _check_input(ends: dict[int, int], records: int | None, partitions: int | None, topic: str) -> int:
    total = sum(ends.values())
    if records is not None and records != total:
        raise ValueError(f"{topic} holds {total:,} records (read_committed), not the {records:,} expected")
    if partitions is not None and partitions != len(ends):
        raise ValueError(f"{topic} has {len(ends)} partitions, not {partitions}")
    return total


# ---------------------------------------------------------------------------------------------
# The peers
# ---------------------------------------------------------------------------------------------


def run_quix(
    bootstrap: str,
    in_topic: str,
    out_topic: str,
    records: int | None = None,
    partitions: int | None = None,
    *,
    pipeline: str = "stateless",
    processes: int = 1,
    broker_pid: int | None = None,
    commit_interval: float = 5.0,
    commit_every: int = 0,
    expected_out: int | None = None,
    out_partitions: int | None = None,
    work_dir: Path | None = None,
    timeout_s: float = 600.0,
    cleanup: bool = True,
    keep: bool = False,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Run the Quix Streams peer (exactly-once) over all of `in_topic` into `out_topic`, from a new
    consumer group; returns its measurements (see the module docstring). `records`/`partitions`,
    when given, are checked against the input. `out_topic` is created if missing (4 partitions for
    the stateless pipeline, 2 for the stateful one, as bench.runs does).

    The stateful pipeline needs `expected_out`, the number of windows it will output
    (bench.inputs.Input.windows_expected): Quix reads its own repartition topic read_committed, so
    the input's end does not say when the counts are out, and the app stops on that count instead;
    it also runs in one process only (the count is per process)."""
    if pipeline == "stateful" and (not expected_out or processes != 1):
        raise ValueError("the stateful Quix peer needs expected_out (windows) and runs in one process")
    python = quix_python(progress)
    ends = _input_ends(bootstrap, in_topic)
    total = _check_input(ends, records, partitions, in_topic)
    _ensure_output(bootstrap, out_topic, out_partitions or (4 if pipeline == "stateless" else 2))
    group = f"bench-quix-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="quix-", dir=work_dir))
    out_schema = VIEW_SCHEMA if pipeline == "stateless" else schemas_dir() / COUNTS_SCHEMA_FILE
    commands, logs, results = [], [], []
    for n in range(processes):
        results.append(work / f"result-{n}.json")
        logs.append(work / f"quix-{n}.log")
        commands.append(
            [
                python, str(QUIX_APP), "--bootstrap", bootstrap, "--input", in_topic, "--output", out_topic,
                "--group", group, "--pipeline", pipeline,
                "--event-schema", str(schemas_dir() / EVENT_SCHEMA_FILE), "--output-schema", str(out_schema),
                "--ends", ",".join(f"{p}:{o}" for p, o in sorted(ends.items())),
                "--state-dir", str(work / f"state-{n}"), "--commit-interval", str(commit_interval),
                "--commit-every", str(commit_every), "--result", str(results[-1]),
                "--expected-out", str(expected_out or 0),
            ]
        )  # fmt: skip
    # Quix's Avro path imports confluent_kafka.schema_registry, which warns about authlib on import.
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        launched, wall, finished, summaries, cpu = _measure(commands, logs, results, broker_pid, timeout_s, env, work)
    finally:
        if cleanup:
            _cleanup(bootstrap, group, (group,))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    firsts = [s["first_record"] for s in summaries if s.get("first_record")]
    return _row(
        f"Quix Streams {QUIXSTREAMS_VERSION} exactly-once",
        pipeline,
        total,
        launched,
        wall,
        finished,
        min(firsts) if firsts else None,
        max(s["done"] for s in summaries),
        sum(s["records_in"] for s in summaries),
        sum(s["records_out"] for s in summaries),
        cpu,
        sum(s["cpu_at_done"] - s["cpu_at_first_record"] for s in summaries if s.get("cpu_at_first_record") is not None),
        processes=processes,
        commit_interval_s=commit_interval,
        commit_every=commit_every,
        **({"work_dir": str(work)} if keep else {}),
    )


def run_kstreams(
    bootstrap: str,
    in_topic: str,
    out_topic: str,
    records: int | None = None,
    partitions: int | None = None,
    *,
    pipeline: str = "stateless",
    threads: int = 2,
    broker_pid: int | None = None,
    commit_interval_ms: int | None = None,
    heap: str = KSTREAMS_HEAP,
    out_partitions: int | None = None,
    work_dir: Path | None = None,
    timeout_s: float = 600.0,
    cleanup: bool = True,
    keep: bool = False,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Run the Kafka Streams peer (exactly_once_v2, `threads` stream threads, one JVM) over all of
    `in_topic` into `out_topic`, as a new application.id; returns its measurements (see the module
    docstring). `commit_interval_ms` None keeps Kafka Streams' default (100 ms under exactly-once)."""
    from eos_ops.localkafka import kafka_version

    ends = _input_ends(bootstrap, in_topic)
    total = _check_input(ends, records, partitions, in_topic)
    _ensure_output(bootstrap, out_topic, out_partitions or (4 if pipeline == "stateless" else 2))
    app_id = f"bench-kstreams-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="kstreams-", dir=work_dir))
    result = work / "result.json"
    cmd = _kstreams_command(
        bootstrap, in_topic, out_topic, app_id, work, pipeline, threads, heap, commit_interval_ms, timeout_s, progress
    )
    cmd += ["--ends", ",".join(f"{p}:{o}" for p, o in sorted(ends.items()))]
    try:
        launched, wall, finished, summaries, cpu = _measure(
            [cmd], [work / "kstreams.log"], [result], broker_pid, timeout_s + 60, cwd=work
        )
    finally:
        if cleanup:
            _cleanup(bootstrap, app_id, (app_id,))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    summary = summaries[0]
    return _row(
        f"Kafka Streams {kafka_version()} exactly_once_v2",
        pipeline,
        total,
        launched,
        wall,
        finished,
        summary["first_record_ms"] / 1000 if summary.get("first_record_ms") else None,
        summary["committed_ms"] / 1000,
        summary["records_in"],
        summary["records_out"],
        cpu,
        summary["cpu_at_done_s"] - summary["cpu_at_first_record_s"] if summary.get("first_record_ms") else None,
        threads=threads,
        commit_interval_ms=commit_interval_ms if commit_interval_ms is not None else 100,
        heap=heap,
        **({"work_dir": str(work)} if keep else {}),
    )


def _kstreams_command(
    bootstrap: str,
    in_topic: str,
    out_topic: str,
    app_id: str,
    work: Path,
    pipeline: str,
    threads: int,
    heap: str,
    commit_interval_ms: int | None,
    timeout_s: float,
    progress: Progress,
) -> list[str]:
    """The Kafka Streams peer's command line; its state and its result (result.json) go to `work`."""
    from eos_ops.localkafka import find_java

    out_schema = VIEW_SCHEMA if pipeline == "stateless" else schemas_dir() / COUNTS_SCHEMA_FILE
    cmd = [
        find_java(), f"-Xmx{heap}", "-cp", kstreams_classpath(progress), KSTREAMS_MAIN,
        "--bootstrap", bootstrap, "--input", in_topic, "--output", out_topic, "--application-id", app_id,
        "--pipeline", pipeline, "--threads", str(threads), "--state-dir", str(work / "state"),
        "--event-schema", str(schemas_dir() / EVENT_SCHEMA_FILE), "--output-schema", str(out_schema),
        "--timeout-s", str(int(timeout_s)), "--result", str(work / "result.json"),
    ]  # fmt: skip
    if commit_interval_ms is not None:
        cmd += ["--commit-interval-ms", str(commit_interval_ms)]
    return cmd


@contextlib.contextmanager
def live_kstreams(
    bootstrap: str,
    in_topic: str,
    out_topic: str,
    *,
    threads: int = 2,
    commit_interval_ms: int | None = None,
    heap: str = KSTREAMS_HEAP,
    work_dir: Path | None = None,
    timeout_s: float = 600.0,
    ready_timeout_s: float = 120.0,
    progress: Progress = _quiet,
) -> Iterator[subprocess.Popen]:
    """The Kafka Streams peer (stateless, exactly_once_v2) on a live input, the latency probe's
    (bench.sections.latency), as a new application.id: the block starts once its stream threads run
    (the group joined, the tasks assigned), so that the probe's first record finds it reading; on
    leaving, its standard input is closed, its signal to close cleanly, and its group and internal
    topics are dropped. A runner that dies closes that input too: the peer never outlives it; nor
    does it run past `timeout_s`. `out_topic` must exist. Yields the peer's process."""
    app_id = f"bench-kstreams-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="kstreams-live-", dir=work_dir))
    ready, log = work / "running", work / "kstreams.log"
    args = (bootstrap, in_topic, out_topic, app_id, work, "stateless", threads, heap, commit_interval_ms, timeout_s)
    cmd = _kstreams_command(*args, progress)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*cmd, "--live", str(ready)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, cwd=work
        )
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                how = f"exited with code {proc.returncode}" if proc.returncode is not None else "was not running"
                raise RuntimeError(
                    f"the Kafka Streams peer {how} within {ready_timeout_s:.0f} s of its start; "
                    f"last lines of {log}:\n{_tail(log)}"
                )
            time.sleep(0.05)
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _cleanup(bootstrap, app_id, (app_id,))
        shutil.rmtree(work, ignore_errors=True)

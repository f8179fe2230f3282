"""The benchmark harness (bench/) works: its cheap parts run for real against the test broker,
and their measured results render into the report. The full benchmark (`python -m bench`, about an
hour) and its quick mode (Spark runs, minutes) are not run here."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from bench import cli, report
from bench.context import FULL, QUICK, Bench, Plan
from bench.env import REPO, Progress, machine
from bench.inputs import count_records, expected_stateless_out, make_input
from bench.rawloop import run_loop
from bench.report import header
from bench.report.summary import targets
from bench.sections import failpoints
from bench.sections.peers import KSTREAMS
from bench.stats import balanced_orders, paired_ratios, percentile, ratio_summary, summarize
from eos_connectors.kafka.clients import admin_client, create_topic


def test_statistics_on_measured_timings() -> None:
    """Medians, spreads and paired ratios of real timings (a busy loop of two sizes)."""

    def timed(n: int) -> float:
        started = time.perf_counter()
        sum(i * i for i in range(n))
        return time.perf_counter() - started

    small = [timed(20_000) for _ in range(5)]
    large = [timed(80_000) for _ in range(5)]
    s = summarize(large)
    assert s.n == 5 and s.low <= s.median <= s.high
    ratios = paired_ratios(large, small)
    assert len(ratios) == 5 and all(r > 0 for r in ratios)
    assert ratio_summary(large, small).median == pytest.approx(sorted(ratios)[2])
    assert percentile(large, 0) == min(large) and percentile(large, 100) == max(large)
    assert summarize([]).n == 0


def test_throughput_rounds_balance_positions_and_predecessors() -> None:
    """Each configuration runs equally often in every position of a round and right after every
    other configuration (a rotation balances positions only: b always follows a)."""
    from collections import Counter

    from bench.report.throughput import throughput_orders
    from bench.runs import CONFIGS

    for n in range(2, 8):
        orders = balanced_orders([f"c{i}" for i in range(n)])
        assert len(orders) == (2 * n if n % 2 else n)
        assert all(sorted(order) == sorted(orders[0]) for order in orders)
        positions = Counter((order.index(c), c) for order in orders for c in order)
        follows = Counter((order[i - 1], order[i]) for order in orders for i in range(1, n))
        assert set(positions.values()) == {len(orders) // n}, (n, positions)
        assert len(follows) == n * (n - 1) and set(follows.values()) == {len(orders) // n}, (n, follows)
    assert FULL.throughput_rounds(len(CONFIGS)) == len(balanced_orders(CONFIGS)) == 10
    assert QUICK.throughput_rounds(len(CONFIGS)) == QUICK.rounds
    # The report says "balanced" only of a full set of orders (quick runs have one round).
    assert "too few" in throughput_orders({"orders": [list(CONFIGS)]})
    assert "are balanced" in throughput_orders({"orders": [list(o) for o in balanced_orders(CONFIGS)]})


def test_raw_loops_are_correct_baselines(bootstrap: str, unique_name, tmp_path: Path) -> None:
    """The raw confluent-kafka loops (the Python ceiling) output what the pipelines must output."""
    source = make_input(bootstrap, unique_name("bench-in"), 2, 2_000)
    admin = admin_client({"bootstrap.servers": bootstrap})
    stateless_out, stateful_out = unique_name("bench-out"), unique_name("bench-out")
    create_topic(admin, stateless_out, 2)
    create_topic(admin, stateful_out, 2)
    plain = run_loop(bootstrap, source.topic, stateless_out, "stateless", None)
    assert plain.records_in == source.records
    assert (
        plain.records_out == count_records(bootstrap, stateless_out) == expected_stateless_out(bootstrap, source.topic)
    )
    transactional = run_loop(bootstrap, source.topic, stateful_out, "stateful", None, transactional=True, batch=500,
                             txn_id=unique_name("bench-txn"))  # fmt: skip
    assert transactional.transactions >= 1
    # Every campaign-minute window of the ground truth, each once.
    assert count_records(bootstrap, stateful_out) == source.windows_expected


def test_failpoints_section_runs_and_renders(bootstrap: str, tmp_path: Path, monkeypatch) -> None:
    """The quick failpoints section on a real transactional producer, then the report from it."""
    plan = dataclasses.replace(QUICK, failpoint_rounds=2, failpoint_records=2_000)
    bench = Bench(plan, bootstrap, None, None, tmp_path, tmp_path, Progress({}))
    result = failpoints.run(bench)
    assert len(result["timings_s"]["disarmed"]) == len(result["timings_s"]["compiled_out"]) == 2
    assert all(t > 0 for ts in result["timings_s"].values() for t in ts)
    assert result["ratio"]["n"] == 2 and result["ratio"]["median"] > 0
    assert 0 < result["hit_ns"] < 10_000

    results = {
        "meta": {
            "date": "now", "command": "pytest", "quick": True, "duration_s": 1.0, "machine": machine(),
            "java": "java", "load": {"skipped": True, "load_at_start": 0.0},
            "spark_kafka": {"version": "x", "token_provider": "x", "pyspark": "x", "jars": []},
        },
        "failpoints": result,
    }  # fmt: skip
    rows = [r for r in targets(results) if r["name"].startswith("failpoints")]
    assert len(rows) == 1 and rows[0]["verdict"] in ("met", "MISSED")
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    out = tmp_path / "BENCHMARKS.md"
    assert cli.main(["--render", str(saved), "--out", str(out)]) == 0
    text = out.read_text()
    assert f"{result['hit_ns']} ns" in text
    assert "## 7. Failpoints, disarmed" in text and "_Not run in this invocation" in text
    assert report.render(results) == text


def test_skewed_input_puts_the_hot_partition_at_its_share(bootstrap: str, unique_name) -> None:
    """The skew section's input: partition 0 holds `hot` times the records of each other one
    (by a stable hash of the key, so duplicates stay with their original)."""
    from eos_connectors.kafka.clients import describe_partitions, end_offsets

    source = make_input(bootstrap, unique_name("bench-hot"), 4, 3_000, hot=10)
    admin = admin_client({"bootstrap.servers": bootstrap})
    ends = end_offsets(admin, describe_partitions(admin, [source.topic]), read_committed=True)
    counts = [ends[(source.topic, p)] for p in range(4)]
    assert sum(counts) == source.records
    cold = counts[1:]
    assert min(cold) > 0
    # 10 shares of 13 on partition 0: within a few percent for ~3,200 records
    assert 8.0 < counts[0] / (sum(cold) / 3) < 12.5


def test_probe_writes_the_hot_partition_at_its_rate(bootstrap: str, unique_name, tmp_path: Path) -> None:
    """The skew section's load: partition 0 at `--hot` times the rate of each other partition."""
    import subprocess
    import sys

    from bench.env import REPO
    from eos_connectors.kafka.clients import describe_partitions, end_offsets

    topic = unique_name("bench-probe-hot")
    admin = admin_client({"bootstrap.servers": bootstrap})
    create_topic(admin, topic, 4)
    result = tmp_path / "probe.json"
    args = ["--bootstrap", bootstrap, "--input", topic, "--rate", "1300", "--warmup", "0", "--measure", "2",
            "--no-probe", "--partitions", "4", "--hot", "10", "--result", str(result)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "bench.probe", *args], cwd=REPO, check=True, timeout=120)
    produced = json.loads(result.read_text())["produced"]
    ends = end_offsets(admin, describe_partitions(admin, [topic]), read_committed=True)
    counts = [ends[(topic, p)] for p in range(4)]
    assert sum(counts) == produced > 1_000
    assert all(abs(c - counts[1]) <= 1 for c in counts[1:])  # round robin over the cold ones
    assert 9.5 < counts[0] / counts[1] < 10.5


def test_data_path_steps_are_measured(bootstrap: str, unique_name) -> None:
    """bench/steps.py times the pipeline's own functions on real records: every step is timed,
    over every record of the input."""
    from bench.steps import step_costs

    source = make_input(bootstrap, unique_name("bench-steps-in"), 2, 2_000)
    out = unique_name("bench-steps-out")
    create_topic(admin_client({"bootstrap.servers": bootstrap}), out, 2)
    result = step_costs(bootstrap, source.topic, out, repeats=1)
    assert result["records"] == source.records
    costs = result["us_per_record"]
    for step in ("consume", "decode", "encode", "produce", "raw: decode", "raw: transform + encode"):
        assert 0 < costs[step] < 10_000, (step, costs)


def test_the_eta_is_not_scaled_by_setup(monkeypatch) -> None:
    """A fast setup (jars already fetched) once scaled a 2-hour plan's ETA down to 30 minutes."""
    from bench import env

    clock = [0.0]
    monkeypatch.setattr(env.time, "monotonic", lambda: clock[0])
    progress = Progress({"setup": 60, "throughput": 600, "latency": 600})
    progress.begin("setup")
    clock[0] = 15.0
    progress.end()
    progress.begin("throughput")
    assert progress.eta_s() == 1200  # setup's 4x speed-up says nothing about the runs
    clock[0] = 315.0
    progress.end()  # throughput took half its estimate: the rest is scaled by that
    assert progress.eta_s() == 300


def test_a_merged_report_names_the_run_each_section_comes_from() -> None:
    full = {"command": "python -m bench", "date": "D1", "sections_run": ["peers", "postgres"]}
    assert header.merged_text(full) == "" and header.run_of(full, "peers") is full
    merge = {"command": "python -m bench --sections postgres --merge", "date": "D2", "sections_run": ["postgres"]}
    merge["merged_into"] = full
    assert "postgres re-run by `python -m bench --sections postgres --merge` on D2" in header.merged_text(merge)
    assert header.run_of(merge, "peers") is full and header.run_of(merge, "postgres") is merge
    assert header.first_run(merge) is full


def test_a_merge_on_a_fresh_clone_keeps_the_other_sections_from_the_tracked_results(tmp_path, monkeypatch) -> None:
    # bench/results is gitignored: without this, `--merge` on a fresh clone rewrote
    # docs/BENCHMARKS.md with only the sections it ran.
    tracked = tmp_path / "benchmarks.json"
    tracked.write_text("{}")
    monkeypatch.setattr(cli, "DOC_JSON", tracked)
    latest = tmp_path / "latest.json"
    assert cli.merge_source(latest, quick=False) == tracked
    assert cli.merge_source(latest, quick=True) is None  # quick runs never merge into the docs' figures
    latest.write_text("{}")
    assert cli.merge_source(latest, quick=False) == latest
    tracked.unlink()
    latest.unlink()
    assert cli.merge_source(latest, quick=False) is None


def test_the_plan_estimates_the_tracked_full_run_within_a_quarter() -> None:
    """The ETA comes from these estimates: before they were refitted they added up to 121 min for
    the 53-minute run of 2026-11-25. The tracked results hold a full run's length, and the plan it
    ran, to check against (a plan that has grown since is estimated longer, as it should be)."""
    first = header.first_run(json.loads((REPO / "docs" / "benchmarks.json").read_text())["meta"])
    assert first["command"] == "python -m bench" and not first["quick"], first["command"]
    plan = Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in first["plan"].items()})
    estimates = plan.estimates()
    planned = estimates["setup"] + sum(estimates[section] for section in first["sections_run"])
    measured = first["duration_s"] - first["load"]["waited_s"]
    assert 0.75 < planned / measured < 1.25, (planned / 60, measured / 60)


def test_the_live_heap_of_a_real_jvm_is_read_after_a_full_collection(tmp_path: Path) -> None:
    """A JVM holding 48 MiB live (in 64 KiB arrays: G1 gives an array of half a region or more a
    region of its own) plus 200 MiB it dropped: jcmd's full collection leaves the live part, the
    committed heap is at least that, and the rest of its RSS is outside the heap."""
    import subprocess

    from bench.procs import live_heap

    source = tmp_path / "Hold.java"
    source.write_text(
        "public class Hold { public static void main(String[] a) throws Exception {"
        " byte[][] kept = new byte[768][]; for (int i = 0; i < 768; i++) kept[i] = new byte[1 << 16];"
        " for (int i = 0; i < 200; i++) { byte[] g = new byte[1 << 20]; g[0] = 1; }"
        ' System.out.println("ready"); System.out.flush(); Thread.sleep(60_000); System.out.println(kept.length); } }'
    )
    jvm = subprocess.Popen(
        ["java", "-Xmx256m", "-XX:+UseG1GC", str(source)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert jvm.stdout is not None and jvm.stdout.readline().strip() == "ready"
        heap = live_heap(jvm.pid)
        assert heap is not None
        assert 48 <= heap["live_mib"] < 100, heap
        assert heap["committed_mib"] >= heap["live_mib"], heap
        assert heap["outside_heap_mib"] > 0, heap
    finally:
        jvm.kill()
        jvm.wait()


def test_the_jit_compiler_threads_of_a_real_jvm_are_found(tmp_path: Path) -> None:
    """A JVM that has run a hot loop has used CPU in its JIT compiler threads; one started with
    -Xint (interpreter only) has none."""
    import subprocess

    from bench.procs import jit_ticks

    source = tmp_path / "Spin.java"
    source.write_text(
        "public class Spin { public static void main(String[] a) throws Exception {"
        " long x = 0; for (int i = 0; i < Integer.parseInt(a[0]); i++) x += Integer.toString(i).length();"
        ' System.out.println("ready " + x); System.out.flush(); Thread.sleep(60_000); } }'
    )
    found = {}
    subprocess.run(["javac", str(source)], check=True, cwd=tmp_path)
    for flags, loops in (([], "20000000"), (["-Xint"], "0")):
        jvm = subprocess.Popen(
            ["java", *flags, "-cp", str(tmp_path), "Spin", loops], stdout=subprocess.PIPE, text=True, cwd=tmp_path
        )
        try:
            assert jvm.stdout is not None and jvm.stdout.readline().startswith("ready")
            found[" ".join(flags)] = jit_ticks([jvm.pid])
        finally:
            jvm.kill()
            jvm.wait()
    assert found[""] and sum(found[""].values()) > 0, found
    assert found["-Xint"] == {}, found


def test_the_cpu_table_shows_the_jvm_s_jit_share() -> None:
    from bench.report.tables import cpu_table

    cpu = {"spark_jvm": 8.0, "spark_jit": 2.0, "python_workers": 3.0, "driver": 0.2, "broker": 0.5, "tools": 0.0}
    runs = {"eos exactly-once": [{"records_in": 1_000_000, "cpu": {**cpu, "other": 0.0, "wall_s": 8.0, "cores": 2}}]}
    header, _, row = [line for line in cpu_table(runs) if line.startswith("|")][:3]
    assert "of which JIT" in header
    assert row.split("|")[2:4] == [" 8.0 ", " 2.0 "], row


def test_a_jvm_whose_heap_fills_towards_its_cap_is_judged_by_its_live_heap() -> None:
    """RSS grows 1.3x as G1 touches more heap; the live heap and the memory outside it stay flat: the
    JVM's RSS row is reported, the heap rows are met. A live heap that grows is MISSED."""
    from bench.report.faults import memory_verdicts

    def run(live_growth: float) -> dict[str, dict]:
        samples = []
        for i in range(100):
            t = i * 6.0
            rss = 900 + 0.5 * t
            sample = {"t_s": t, "spark_jvm": {"rss_sum_mib": rss, "rss_max_mib": rss, "processes": 1}}
            if i % 10 == 5:
                live = 200 + live_growth * t
                sample["spark_heap"] = {"live_mib": live, "outside_heap_mib": 400.0, "processes": 1}
            samples.append(sample)
        return {v["what"]: v for v in memory_verdicts({"duration_s": 600, "samples": samples})}

    flat = run(0.0)
    rss = flat["Spark JVM RSS (largest process)"]
    assert rss["ratio"] > 1.1 and rss["verdict"] == "reported"
    assert flat["Spark JVM live heap (after a full GC)"]["verdict"] == "met"
    assert flat["Spark JVM outside the heap (RSS - resident heap)"]["verdict"] == "met"
    leaking = run(0.5)
    assert leaking["Spark JVM live heap (after a full GC)"]["verdict"] == "MISSED"
    without_heap = memory_verdicts(
        {
            "duration_s": 600,
            "samples": [
                {"t_s": i * 6.0, "spark_jvm": {"rss_max_mib": 900 + 3.0 * i, "processes": 1}} for i in range(100)
            ],
        }
    )
    assert without_heap[0]["verdict"] == "MISSED"  # no heap rows: RSS judges, as before


def test_the_transactions_section_measures_the_broker_and_renders(kafka, bootstrap: str, tmp_path: Path) -> None:
    """The quick transactions section against the test broker's process: every shape measured in
    every round, the epoch's extra derived from them, and its paragraph in the report."""
    from bench.report.epochs import transaction_cost
    from bench.sections import transactions

    if kafka.kind != "local":
        pytest.skip(f"the broker's CPU is read from /proc: the Kafka under test is {kafka.kind}, not a local process")
    bench = Bench(QUICK, bootstrap, kafka.broker.pid(), None, tmp_path, tmp_path, Progress({}))
    result = transactions.run(bench)
    assert all(len(v) == result["rounds"] for v in result["broker_cpu_ms"].values())
    summary = result["summary"]
    assert set(summary) == {"idempotent", "slot transaction", "decision transaction"}
    assert all(v["client_ms"] > 0 and v["low"] <= v["broker_cpu_ms"] <= v["high"] for v in summary.values())
    assert result["epoch_extra_low_ms"] <= result["epoch_extra_ms"] <= result["epoch_extra_high_ms"]
    units, idle = result["units"], result["broker_cpu_ms"]["idle"]
    first = {s: (v[0] - idle[0]) / units for s, v in result["broker_cpu_ms"].items()}  # round 1's own extra
    own = 2 * (first["slot transaction"] - first["idempotent"]) + first["decision transaction"]
    assert result["epoch_extra_low_ms"] - 0.11 <= own <= result["epoch_extra_high_ms"] + 0.11
    text = "\n".join(transaction_cost({"transactions": result}))
    assert "What transactions cost the broker" in text and f"~{result['epoch_extra_ms']:.0f} ms" in text


def test_spark_settings_for_the_benchmark_session_are_key_value_pairs() -> None:
    provider = "spark.sql.streaming.stateStore.providerClass"
    assert cli.spark_conf([f"{provider}=a.B", "spark.x= y=z"]) == {provider: "a.B", "spark.x": " y=z"}
    for bad in ("no-equals", "=value"):
        with pytest.raises(SystemExit, match="expected KEY=VALUE"):
            cli.spark_conf([bad])


def test_jvm_samples_are_sorted_by_thread_kind_and_innermost_frame(tmp_path: Path) -> None:
    """async-profiler's collapsed stacks: compiler and GC threads by name, the rest by the innermost
    frame that names a step, native (RocksDB) or Java."""
    from bench.jvmprofile import jvm_summary

    collapsed = tmp_path / "jvm.collapsed"
    collapsed.write_text(
        "[C2 CompilerThre tid=11];thread_native_entry;CompileBroker::compiler_thread_loop;"
        "G1BarrierSetC2::post_barrier 30\n"
        "[GC Thread#1 tid=12];G1ParScanThreadState::trim_queue 10\n"
        "[Executor task launch worker for task 0.0 in stage 3.0 (TID 7) tid=40];"
        "org/apache/spark/executor/Executor$TaskRunner.run;"
        "org/apache/spark/sql/execution/streaming/state/RocksDB.put;org/rocksdb/RocksDB.put;"
        "rocksdb::MemTable::Add 50\n"
        "[Executor task launch worker for task 1.0 in stage 3.0 (TID 8) tid=41];"
        "org/apache/spark/executor/Executor$TaskRunner.run;java/lang/Object.hashCode 10\n"
        "[stream execution thread for eos-a7 [id = 5fa0-9c, runId = e1c2-7d] tid=50];"
        "org/apache/spark/sql/execution/streaming/MicroBatchExecution.runActivatedStream 5\n"
        "[stream execution thread for eos-b3 [id = 0bd4-2a, runId = 77fe-c1] tid=51];"
        "org/apache/spark/sql/execution/streaming/MicroBatchExecution.runActivatedStream 5\n"
    )
    summary = jvm_summary(collapsed)
    assert summary["samples"] == 110
    steps = dict(summary["steps"])
    assert steps == {
        "state store": 45.5,
        "JIT compiler": 27.3,
        "garbage collection": 9.1,
        "task execution (rows, generated code)": 9.1,
        "streaming engine (micro-batch loop)": 9.1,
    }, steps
    threads = dict(summary["threads"])
    assert threads["Executor task launch worker for task N.N in stage N.N (TID N)"] == 54.5
    assert threads["stream execution thread (the query's)"] == 9.1  # one row for every query
    assert summary["self"][0] == ("rocksdb::MemTable::Add", 45.5)


def test_async_profiler_samples_a_real_jvm(tmp_path: Path) -> None:
    """Fetched from Maven Central (once per $EOS_HOME), loaded into a running JVM with jcmd, it
    finds the JVM's hot method and the native code it calls."""
    import subprocess

    from bench.jvmprofile import JvmRecorder, jvm_summary, library

    lib, why_not = library(print)
    assert lib is not None, why_not
    source = tmp_path / "Hot.java"
    source.write_text(
        "public class Hot { static double spin(long n) { double x = 0; for (long i = 0; i < n; i++)"
        " x += Math.sqrt(i) * StrictMath.sin(i); return x; }"
        ' public static void main(String[] a) throws Exception { System.out.println("ready"); System.out.flush();'
        " while (true) spin(1_000_000); } }"
    )
    subprocess.run(["javac", str(source)], check=True, cwd=tmp_path)
    jvm = subprocess.Popen(["java", "-cp", str(tmp_path), "Hot"], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert jvm.stdout is not None and jvm.stdout.readline().startswith("ready")
        recorder = JvmRecorder(lib, tmp_path / "hot.collapsed", jvm.pid, interval_ms=2)
        assert recorder.start()
        time.sleep(1.5)
        out = recorder.stop()
    finally:
        jvm.kill()
        jvm.wait()
    assert out is not None
    summary = jvm_summary(out)
    assert summary["samples"] > 100, summary
    frames = out.read_text()
    assert "Hot.spin" in frames and "[main tid=" in frames, frames[:2000]


def _latency_run(trigger: str, mode: str, run: int, p50: float, p99: float) -> dict:
    epochs = [] if mode == KSTREAMS else [{"trigger_s": 0.12}, {"trigger_s": 0.1}]
    cpu = {"driver": 0.5, "spark_jvm": 1.0, "python_workers": 0.5, "broker": 0.5, "tools": 0.5}
    return {"trigger": trigger, "mode": mode, "run": run, "p50_s": p50, "p99_s": p99, "max_s": p99 + 0.1,
            "visible": 900, "expected": 900, "missing": 0, "epochs": epochs, "cpu": cpu,
            "cpu_us_per_record": 3e3}  # fmt: skip


def _latency_section(eo_p99s: tuple[float, float], peer_p99s: tuple[float, float]) -> dict:
    from bench.runs import ALO, BUILTIN, EO

    runs = []
    for run in (0, 1):
        runs += [
            _latency_run("100ms", EO, run, 0.15, eo_p99s[run]),
            _latency_run("100ms", ALO, run, 0.01, 0.03),
            _latency_run("100ms", BUILTIN, run, 0.2, 0.4),
            _latency_run("100ms", KSTREAMS, run, 0.12 + 0.02 * run, peer_p99s[run]),
        ]
    runs += [_latency_run("1s", mode, 0, 0.6, 1.2) for mode in (EO, ALO, BUILTIN)]
    return {"rate": 1000, "warmup_s": 10, "measure_s": 30, "runs": runs}


def test_the_latency_table_sets_exactly_once_at_100ms_beside_kafka_streams() -> None:
    """Kafka Streams' rows (exactly_once_v2 at its 100 ms commit interval) are medians with spreads like
    eos's, and at the 100 ms trigger they are exactly-once's baseline: p99 <= 300 ms and no worse
    than Kafka Streams' p99, paired by run; other triggers keep at-least-once and trigger + 1 s."""
    from bench.report.latency import latency
    from bench.sections.latency import modes

    assert KSTREAMS in modes("100ms") and KSTREAMS not in modes("1s")
    assert "100ms" in FULL.latency_triggers and "100ms" in QUICK.latency_triggers

    def rows(section: dict) -> dict[tuple[str, str], list[str]]:
        lines = [line for line in latency({"latency": section}) if line.startswith("| ")][1:]
        cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
        return {(c[0], c[1]): c[2:] for c in cells}

    # eos 0.25 / 0.27 s against Kafka Streams 0.30 / 0.28 s: run by run 0.83x and 0.96x
    table = rows(_latency_section((0.25, 0.27), (0.30, 0.28)))
    peer = table[("100ms", KSTREAMS)]
    assert peer[:2] == ["0.13 s [0.12–0.14]", "0.29 s [0.28–0.30]"], peer
    assert peer[5] == "–" and peer[6] == "–", peer  # no epochs, no baseline
    eo = table[("100ms", "eos exactly-once")]
    assert eo[1] == "0.26 s [0.25–0.27]", eo
    assert eo[6:] == [f"{KSTREAMS} p99", "0.90× [0.83–0.96]", "≤ 0.3 s, ≤ 1.00×", "met"], eo
    assert table[("1s", "eos exactly-once")][6:] == ["eos at-least-once p99", "1.00×", "≤ 2 s", "met"]
    # Under 300 ms, but worse than Kafka Streams in the same run: missed
    eo = rows(_latency_section((0.25, 0.27), (0.20, 0.22)))[("100ms", "eos exactly-once")]
    assert eo[7:] == ["1.24× [1.23–1.25]", "≤ 0.3 s, ≤ 1.00×", "MISSED"], eo

    summary = {r["name"]: r for r in targets({"latency": _latency_section((0.25, 0.31), (0.30, 0.28))})}
    assert summary["latency p99, trigger 100ms"]["target"] == "≤ 0.3 s"
    assert summary["latency p99, trigger 100ms"]["verdict"] == "met"  # median 0.28 s
    versus = summary[f"latency p99, trigger 100ms: exactly-once vs {KSTREAMS} (commit.interval.ms=100)"]
    assert (versus["value"], versus["verdict"]) == ("0.97× [0.83–1.11]", "met"), versus
    assert not any("1s: exactly-once vs" in name for name in summary)


def test_the_latency_sections_discarded_warm_ups_are_named_and_judge_nothing() -> None:
    """Each Spark configuration's first run of a session (Spark's planner not yet compiled by the
    JIT) is discarded: the report names it and its p99, and no row or verdict counts it."""
    from bench.report.latency import latency
    from bench.runs import ALO, BUILTIN, EO

    section = _latency_section((0.25, 0.27), (0.30, 0.28))
    plain = [line for line in latency({"latency": section}) if line.startswith("| ")]
    section["warm_ups"] = [
        {"trigger": "100ms", "mode": mode, "p50_s": 0.4, "p99_s": p99, "visible": 900, "expected": 900}
        for mode, p99 in ((EO, 0.93), (ALO, 0.43), (BUILTIN, 0.41))
    ]
    text = latency({"latency": section})
    assert [line for line in text if line.startswith("| ")] == plain  # the table is the measured runs' only
    said = [line for line in text if "discarded" in line]
    assert len(said) == 1 and "100ms trigger" in said[0], said
    assert f"{EO} p99 0.93 s" in said[0] and f"{BUILTIN} p99 0.41 s" in said[0], said
    summary = {r["name"]: r for r in targets({"latency": section})}
    assert summary["latency p99, trigger 100ms"]["verdict"] == "met"  # 0.26 s: the 0.93 s counts nowhere


def test_throughput_per_core_at_a_100ms_trigger_is_judged_without_the_probes_cpu() -> None:
    """Issue 38: throughput at a 100 ms trigger >= 0.8x at 1 s. The latency runs carry the same rate at
    both triggers, so the ratio is the pipeline's CPU per record at 1 s over at 100 ms; the probe's
    own CPU ("tools", the same at both) is left out, or it would pull every ratio towards 1."""

    def run(trigger: str, pipeline_s: float) -> dict:
        cpu = {"driver": pipeline_s / 4, "spark_jvm": pipeline_s / 4, "python_workers": pipeline_s / 4}
        cpu |= {"broker": pipeline_s / 4, "tools": 30.0}
        return {"trigger": trigger, "mode": "eos exactly-once", "produced": 10_000, "cpu": cpu}

    name = (
        "throughput per core at a 100 ms trigger vs at 1 s "
        "(exactly-once, the same input rate: CPU per record at 1 s over at 100 ms)"
    )
    slow = {r["name"]: r for r in targets({"latency": {"runs": [run("100ms", 8.0), run("1s", 6.0)]}})}[name]
    assert (slow["measured"], slow["baseline"], slow["value"], slow["verdict"]) == (
        "800 µs CPU/record at 100 ms", "600 µs at 1 s", "0.75×", "MISSED"
    ), slow  # fmt: skip
    fine = {r["name"]: r for r in targets({"latency": {"runs": [run("100ms", 7.0), run("1s", 6.0)]}})}[name]
    assert (fine["value"], fine["verdict"]) == ("0.86×", "met"), fine
    assert not any(r["name"] == name for r in targets({"latency": {"runs": [run("1s", 6.0)]}}))


def _tiny_pom(path: Path) -> Path:
    """A pom whose one dependency's coordinate comes from properties."""
    path.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>dev.eos.test</groupId><artifactId>fetch-jars</artifactId><version>1</version>"
        "<packaging>pom</packaging><dependencies><dependency><groupId>${dep.group}</groupId>"
        "<artifactId>slf4j-api</artifactId><version>${dep.version}</version></dependency></dependencies></project>"
    )
    return path


def test_fetch_jars_passes_properties_and_keys_its_cache_by_them(tmp_path: Path, monkeypatch) -> None:
    """Properties reach Maven as -D (the pom has no version of its own) and are part of the cache's
    key; a complete cache is used without Maven."""
    from eos_ops.jvm import fetch_jars, jar_cache_dir

    pom, root = _tiny_pom(tmp_path / "pom.xml"), tmp_path / "cache"
    properties = {"dep.group": "org.slf4j", "dep.version": "2.0.17"}
    libs = fetch_jars(pom, root, "slf4j", properties=properties)
    assert [p.name for p in libs.glob("*.jar")] == ["slf4j-api-2.0.17.jar"]
    assert libs.parent == jar_cache_dir(pom, root, properties) != jar_cache_dir(pom, root)
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn from here on
    assert fetch_jars(pom, root, "slf4j", properties=properties) == libs
    assert fetch_jars(pom, root, "slf4j", properties=properties, optional=True) == (libs, "")


def test_fetch_jars_optional_says_why_a_tool_is_missing(tmp_path: Path, monkeypatch) -> None:
    """Optional mode (for tools such as the profiler): what Maven Central does not have is None with
    Maven's own words, remembered for a day (not asked again). No mvn at all is None too, and not
    remembered: installing Maven is enough. Required mode raises, and asks again."""
    from eos.errors import EnvironmentProblem
    from eos_ops.jvm import fetch_jars

    pom, root = _tiny_pom(tmp_path / "pom.xml"), tmp_path / "cache"
    absent = {"dep.group": "dev.eos.test.absent", "dep.version": "0.0.1"}
    libs, why = fetch_jars(pom, root, "absent", properties=absent, key="absent", optional=True)
    assert libs is None and "Maven could not fetch the absent jars" in why, why
    assert "dev.eos.test.absent:slf4j-api" in why and (root / "absent" / ".missing").read_text() == why
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn from here on
    assert fetch_jars(pom, root, "absent", properties=absent, key="absent", optional=True) == (None, why)
    with pytest.raises(EnvironmentProblem, match=r"Maven \(mvn\) was not found"):
        fetch_jars(pom, root, "absent", properties=absent, key="absent")
    libs, why = fetch_jars(pom, root, "other", properties=absent, key="other", optional=True)
    assert libs is None and "Maven (mvn) was not found" in why and not (root / "other").exists()


def test_the_jvm_reader_experiment_swaps_the_kafka_source_only_inside_and_pairs_its_ratios() -> None:
    from bench.sections import jvmreader
    from eos import registry

    before, sink = registry.source_kinds()["kafka"], registry.sink_kinds()["kafka"]
    with jvmreader.spark_reader(jvmreader.SparkAvroSource):
        assert registry.source_kinds()["kafka"] is jvmreader.SparkAvroSource
        assert registry.sink_kinds()["kafka"] is sink  # the sink stays eos's
    assert registry.source_kinds()["kafka"] is before
    with pytest.raises(RuntimeError), jvmreader.spark_reader(jvmreader.SparkReadSource):
        raise RuntimeError("a failed run")
    assert registry.source_kinds()["kafka"] is before  # restored after a failure too

    def row(config: str, round_no: int, rps: float) -> dict:
        return {"config": config, "round": round_no, "rps_wall": rps, "cpu_us_per_record": 20.0, "slots": 2}

    runs = {
        jvmreader.EO: [row(jvmreader.EO, 0, 100.0), row(jvmreader.EO, 1, 50.0)],
        jvmreader.JVM: [row(jvmreader.JVM, 0, 80.0), row(jvmreader.JVM, 1, 45.0)],
        jvmreader.JVM_AVRO: [row(jvmreader.JVM_AVRO, 1, 55.0)],
    }
    section = {"input": {"records": 1000}, "epoch_records": 100, "runs": runs}
    text = "\n".join(jvmreader.report({"jvmreader": section}))
    # paired within a round: 0.8 and 0.9 (not the ratio of medians, 62.5/75); one round only: 1.1
    assert "| 0.85× [0.80–0.90] | 1.00× [1.00–1.00] |" in text and "| 1.10× | 1.00× |" in text, text

"""What every section shares: the plan (sizes, full or quick), the broker, the SparkSession, the
inputs, where files go, and progress output."""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.env import Progress
from bench.inputs import Input, make_input
from bench.stats import balanced_orders


@dataclass(frozen=True)
class Plan:
    quick: bool
    rounds: int  # rounds of paired runs (throughput: see throughput_rounds)
    events: int  # throughput input: distinct events (records are ~8% more: duplicates)
    partitions: int
    epoch_records: int  # max_records_per_epoch / maxOffsetsPerTrigger of the throughput rows
    warmup_events: int
    perf_records: int
    latency_triggers: tuple[str, ...]
    latency_rate: int  # records/s the load generator writes
    latency_warmup_s: float
    latency_measure_s: float
    latency_runs: int
    scaling_events: int
    scaling_partitions: tuple[int, ...]
    scaling_epoch_records: tuple[int, ...]
    scaling_runs: int
    recovery_points: tuple[str, ...]
    recovery_runs: int
    recovery_events: int
    recovery_epoch_records: int
    memory_duration_s: float
    memory_rate: int
    failpoint_rounds: int
    failpoint_records: int
    profile_events: int
    epoch_cost_events: int  # fixed cost per epoch: the input, read in tiny epochs
    epoch_cost_records: int  # records per tiny epoch (over every partition)
    skew_hot: int  # the hot partition's rate over each other partition's
    skew_trigger: str
    skew_latency_runs: int
    cluster_events: int
    cluster_rounds: int
    cluster_timeout_s: float
    cluster_cores: tuple[int, ...] = (1, 2, 4)  # executor cores in total, each against local[2]

    def throughput_rounds(self, configurations: int) -> int:
        """Full runs: as many rounds as a balanced set of orders has (bench.stats.balanced_orders:
        ten for five configurations), repeated until there are at least `rounds`; quick runs:
        `rounds` (bench.sections.throughput says why)."""
        if self.quick:
            return self.rounds
        orders = len(balanced_orders(range(configurations)))
        return orders * math.ceil(self.rounds / orders)

    def estimates(self) -> dict[str, float]:
        """Seconds each section is expected to take (for the ETA): fixed seconds per run plus
        records over the rates of the full run of 2026-11-25 on the 2-core machine (53 min)."""
        records = self.events * 1.08  # duplicates and the heartbeat
        # eos exactly-once and at-least-once ~75,000 records/s, Spark ~70,000, the raw loops ~100,000
        round_s = 5 * 1.2 + records * (2 / 75_000 + 1 / 70_000 + 2 / 100_000)
        warmup = 4 * (5 + records / 60_000)  # the throughput section warms up on its own input
        perf = self.rounds * (8 + self.perf_records / 400_000)
        # three configurations per trigger, and the Kafka Streams peer at 100 ms (its JVM's start: ~8 s more)
        latency_run = self.latency_warmup_s + self.latency_measure_s + 4
        latency = 3 * latency_run + self.latency_runs * (  # a discarded run of each Spark configuration first
            len(self.latency_triggers) * 3 * latency_run + ("100ms" in self.latency_triggers) * (latency_run + 8)
        )
        scaling_run = 1.5 + self.scaling_events * 1.08 / 90_000
        small_epochs = self.scaling_events * 1.08 / min(self.scaling_epoch_records) * 0.15
        return {
            "setup": 15 + self.events / 40_000,
            "throughput": warmup + self.throughput_rounds(5) * 2 * round_s + perf,
            "latency": latency,
            "protocol": 0,
            "scaling": self.scaling_runs
            * (
                len(self.scaling_partitions) * scaling_run
                + len(self.scaling_epoch_records) * 2 * scaling_run
                + small_epochs
            ),
            "recovery": len(self.recovery_points) * self.recovery_runs * 40,
            # per round a hot and a cold run: three or two Spark drivers' start-ups, a drain of the input
            "failover": (1 if self.quick else 5) * 2 * 60,
            # two warm-ups and two of each Spark-reader configuration, then 3 runs in each of 2 x rounds rounds
            "jvmreader": (6 + 6 * self.rounds) * (5 + records / 60_000),
            "memory": self.memory_duration_s + 25,
            "failpoints": 3 + self.failpoint_rounds * 3 * self.failpoint_records / 1_000_000,
            "producer": 5 if self.quick else 10,
            "transactions": 15 if self.quick else 70,
            # warm-ups of both pipelines, 7 profiled runs of the profile's input, and the tiny epochs
            "profile": 20 + 4 * (4 + self.warmup_events / 40_000) + 8 * (6 + self.profile_events * 1.08 / 25_000),
            "peers": 30 + self.rounds * 2 * (3 * 6 + records * (1 / 80_000 + 1 / 25_000 + 1 / 60_000)),
            "epochcost": self.rounds * 3 * (2 + self.epoch_cost_events * 1.08 / self.epoch_cost_records * 0.11),
            "skew": 2 * (5 + records / 60_000)  # its warm-up on the full-size input
            + self.rounds * 2 * (2 + records / 80_000)
            + self.skew_latency_runs * 2 * (self.latency_warmup_s + self.latency_measure_s + 3),
            "cluster": 40
            + self.cluster_rounds * (1 + len(self.cluster_cores)) * (12 + self.cluster_events * 1.08 / 15_000),
            "postgres": 10 + self.rounds * 2 * (1 + records / 80_000),
        }


FULL = Plan(
    quick=False,
    rounds=3,
    events=400_000,
    partitions=4,
    epoch_records=50_000,
    warmup_events=50_000,
    perf_records=2_000_000,
    latency_triggers=("100ms", "0.5s", "1s", "5s"),
    latency_rate=1_000,
    latency_warmup_s=10,
    latency_measure_s=30,
    latency_runs=2,
    scaling_events=200_000,
    scaling_partitions=(1, 4, 16),
    scaling_epoch_records=(10_000, 50_000, 200_000),
    scaling_runs=3,
    recovery_points=("sink.after_precommit", "sink.between_commits", "epoch.after_commit"),
    recovery_runs=2,
    recovery_events=100_000,
    recovery_epoch_records=20_000,
    memory_duration_s=600,
    memory_rate=1_000,
    failpoint_rounds=15,
    failpoint_records=100_000,
    profile_events=200_000,
    epoch_cost_events=2_000,
    epoch_cost_records=40,
    skew_hot=10,
    skew_trigger="1s",
    skew_latency_runs=2,
    cluster_events=200_000,
    cluster_rounds=3,
    cluster_timeout_s=900,
)

QUICK = Plan(
    quick=True,
    rounds=1,
    events=20_000,
    partitions=4,
    epoch_records=10_000,
    warmup_events=5_000,
    perf_records=200_000,
    latency_triggers=("100ms", "1s"),
    latency_rate=500,
    latency_warmup_s=5,
    latency_measure_s=10,
    latency_runs=1,
    scaling_events=20_000,
    scaling_partitions=(1, 4),
    scaling_epoch_records=(5_000, 20_000),
    scaling_runs=1,
    recovery_points=("sink.between_commits",),
    recovery_runs=1,
    recovery_events=10_000,
    recovery_epoch_records=5_000,
    memory_duration_s=30,
    memory_rate=500,
    failpoint_rounds=3,
    failpoint_records=5_000,
    profile_events=20_000,
    epoch_cost_events=400,
    epoch_cost_records=40,
    skew_hot=10,
    skew_trigger="1s",
    skew_latency_runs=1,
    cluster_events=20_000,
    cluster_rounds=1,
    cluster_timeout_s=600,
    cluster_cores=(2,),
)


@dataclass
class Bench:
    plan: Plan
    bootstrap: str
    broker_pid: int | None
    spark: Any
    work: Path  # checkpoints, pipeline files, profiles (deleted at the end unless --keep)
    results: Path  # bench/results
    progress: Progress
    connector: Any = None
    inputs: dict[tuple[int, int, int], Input] = field(default_factory=dict)
    profile: bool = True
    warmed_at: float | None = None  # bench.runs.warm_up's last warm-up (time.monotonic())

    def say(self, message: str) -> None:
        self.progress.say(message)

    def input(self, events: int, partitions: int, hot: int = 1) -> Input:
        """The input topic of `events` events over `partitions` partitions (written once); `hot` > 1:
        partition 0 holds `hot` times the records of each other partition."""
        key = (events, partitions, hot)
        if key not in self.inputs:
            topic = f"bench-input-{events}-p{partitions}" + (f"-hot{hot}" if hot > 1 else "")
            self.say(f"writing input {topic} ({events:,} events) ...")
            self.inputs[key] = make_input(self.bootstrap, topic, partitions, events, hot=hot)
        return self.inputs[key]

    def checkpoint(self, name: str) -> Path:
        return self.work / "checkpoints" / name

    def config(
        self, pipeline: str, name: str, topic: str, out_topic: str, exactly_once: bool = True, **settings: Any
    ) -> dict[str, Any]:
        """The benchmark's `pipeline` ("stateless" or "stateful", bench.pipelines) as an eos config named
        `name`, on this broker, its checkpoint in the work folder; `settings`: epoch_records, trigger,
        out_partitions."""
        from bench.pipelines import config_for

        mode = "exactly-once" if exactly_once else "at-least-once"
        return config_for(
            pipeline, name=name, bootstrap=self.bootstrap, topic=topic, out_topic=out_topic,
            checkpoint=self.checkpoint(name), mode=mode, **{"epoch_records": None, **settings},
        )  # fmt: skip


def work_dir() -> Path:
    from eos.paths import eos_home

    root = eos_home() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

"""Kafka's own perf tools (kafka-tools, in the local broker's jar cache): the machine's ceiling.

ProducerPerformance writes N records of the input's mean value size with the producer settings
eos's sink uses; ConsumerPerformance reads the benchmark's input topic (read_committed). A
pipeline must both consume and produce every record, so its ceiling is the slower of the two
(an upper bound: on 2 cores the two also compete for CPU); both tools are reported. The rates are the tools'
own, measured after their JVM started.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from eos.errors import EnvironmentProblem
from eos_ops.localkafka import find_java, java_classpath


@dataclass
class PerfRun:
    producer_rps: float
    consumer_rps: float

    @property
    def pipeline_ceiling_rps(self) -> float:
        """A pipeline moves no record faster than the slower of consuming and producing it."""
        return min(self.producer_rps, self.consumer_rps)


def _run(args: list[str], timeout: float) -> str:
    cmd = [find_java(), "-Xmx512m", "-cp", java_classpath(), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise EnvironmentProblem(f"{args[0]} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-2000:]}")
    return result.stdout


def producer_perf(bootstrap: str, topic: str, partitions: int, records: int, record_size: int) -> float:
    """Records/s of ProducerPerformance (its final summary line), into a new topic."""
    from eos_connectors.kafka.clients import admin_client, create_topic

    create_topic(admin_client({"bootstrap.servers": bootstrap}), topic, partitions)
    out = _run(
        [
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(record_size),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=all",
            "enable.idempotence=true",
            "linger.ms=5",
            "batch.size=1000000",
            "compression.type=lz4",
        ],
        timeout=600,
    )
    # "200000 records sent, 181818.2 records/sec (14.55 MB/sec), ..."
    match = re.findall(r"(\d+) records sent, ([\d.]+) records/sec", out)
    if not match:
        raise EnvironmentProblem(f"ProducerPerformance printed no summary:\n{out[-1500:]}")
    return float(match[-1][1])


def consumer_perf(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of ConsumerPerformance (its nMsg.sec column: fetch time, JVM start excluded)."""
    with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as config:
        config.write("isolation.level=read_committed\nfetch.max.bytes=67108864\nmax.partition.fetch.bytes=16777216\n")
    try:
        out = _run(
            [
                "org.apache.kafka.tools.ConsumerPerformance",
                "--bootstrap-server",
                bootstrap,
                "--topic",
                topic,
                "--num-records",
                str(records),
                "--timeout",
                "60000",
                "--command-config",
                config.name,
                "--group",
                f"bench-perf-{os.getpid()}-{os.urandom(4).hex()}",
            ],
            timeout=600,
        )
    finally:
        os.unlink(config.name)
    lines = [line for line in out.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if "nMsg.sec" in line), None)
    if header is None or header + 1 >= len(lines):
        raise EnvironmentProblem(f"ConsumerPerformance printed no table:\n{out[-1500:]}")
    names = [c.strip() for c in lines[header].split(",")]
    values = [c.strip() for c in lines[header + 1].split(",")]
    row = dict(zip(names, values, strict=False))
    return float(row["nMsg.sec"])

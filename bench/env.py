"""The benchmark's environment: preflight checks, the machine, waiting for quiet, progress lines."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eos.errors import EnvironmentProblem

REPO = Path(__file__).resolve().parent.parent


def preflight() -> dict[str, str]:
    """Java 17+ and Maven are needed (the broker, the perf tools and Spark's Kafka connector are
    Java); say so clearly before anything starts."""
    from eos_ops.localkafka import find_java

    java = find_java()  # raises EnvironmentProblem with a hint when missing or too old
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem(
            "Maven (mvn) was not found: the benchmark resolves the Kafka broker and Spark's Kafka connector "
            "(spark-sql-kafka-0-10) from Maven Central with it.",
            hint="install Maven (e.g. `apt install maven`)",
        )
    if not shutil.which("py-spy", path=str(Path(sys.executable).parent)) and not shutil.which("py-spy"):
        raise EnvironmentProblem(
            "py-spy was not found: the benchmark profiles the driver and the Python workers with it.",
            hint="pip install -e '.[bench]'",
        )
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return {"java": java, "java_version": version, "mvn": mvn}


def py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else (shutil.which("py-spy") or "py-spy")


def machine() -> dict[str, object]:
    import confluent_kafka
    import pyspark

    from eos_ops.localkafka import kafka_version

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": kafka_version(),
    }


def host_check_ms(repeats: int = 5) -> float:
    """CPU milliseconds of a fixed pure-Python loop, the best of `repeats`: how fast this host runs
    one core right now. The same machine ran the same fastavro loop at 2.1 and at 4.3 µs a record
    a minute apart (2026-11-25, no steal in /proc/stat), so a figure measured on a slow minute and
    re-run on a fast one differs by the host, not the code. The report prints the check beside each
    section and run; comparing it between two runs says whether their hosts ran alike. CPU time,
    not wall: another process on the same cores slows the wall clock, not this loop's CPU. The host
    changes speed in phases of seconds to minutes (the check read 15.5 ms, then ~30 ms for 10 s
    with the machine idle, then 15.5 ms again), so one check tells about its moment only."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        total = 0
        for i in range(300_000):
            total = (total + i * 7) % 1_000_003
        best = min(best, time.process_time() - started)
    return round(best * 1000, 1)


def wait_for_quiet(threshold: float, max_wait_s: float, say) -> dict[str, float | bool]:
    """Wait until the 1-minute load average drops below `threshold` (other engineers run tests
    on this machine), at most max_wait_s; then run anyway and record what the load was."""
    started = time.monotonic()
    first = os.getloadavg()[0]
    announced = 0.0
    while os.getloadavg()[0] >= threshold and time.monotonic() - started < max_wait_s:
        waited = time.monotonic() - started
        if waited - announced >= 60 or announced == 0:
            say(f"waiting for a quiet machine: load {os.getloadavg()[0]:.2f} >= {threshold} ({waited:.0f}s waited)")
            announced = waited or 1e-9
        time.sleep(10)
    load = os.getloadavg()[0]
    return {
        "threshold": threshold,
        "load_at_first_check": round(first, 2),
        "waited_s": round(time.monotonic() - started, 1),
        "load_at_start": round(load, 2),
        "quiet": load < threshold,
    }


@dataclass
class Progress:
    """One line per step on stderr: elapsed time, section, step, and an ETA from the plan."""

    estimates: dict[str, float]  # section -> estimated seconds
    started: float = field(default_factory=time.monotonic)
    done: dict[str, float] = field(default_factory=dict)  # section -> actual seconds
    section: str = ""
    section_started: float = 0.0

    def begin(self, section: str) -> None:
        self.section, self.section_started = section, time.monotonic()
        self.say(f"== {section} (estimated {self.estimates.get(section, 0) / 60:.1f} min) ==")

    def end(self) -> None:
        self.done[self.section] = time.monotonic() - self.section_started

    def exclude(self, seconds: float) -> None:
        """Time spent waiting (for a quiet machine) is not the section's work: keep it out of the ETA."""
        self.section_started += seconds

    def eta_s(self) -> float:
        """Remaining estimate, scaled by how the finished sections compared with their estimates.
        Setup does not count: it is mostly the broker's start and one-off downloads, and scaling two
        hours of runs by it once showed "ETA ~30 min" at the start of a 1-hour run."""
        measured = [s for s in self.done if s != "setup"]
        spent = sum(self.done[s] for s in measured)
        planned = sum(self.estimates.get(s, 0) for s in measured)
        scale = spent / planned if planned > 0 and spent > 0 else 1.0
        remaining = sum(v for s, v in self.estimates.items() if s not in self.done and s != self.section)
        in_section = 0.0
        if self.section not in self.done:
            in_section = max(0.0, self.estimates.get(self.section, 0) - (time.monotonic() - self.section_started))
        return scale * (remaining + in_section)

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        stamp = f"{int(elapsed // 60):02d}:{int(elapsed % 60):02d}"
        eta = self.eta_s()
        print(f"[bench {stamp} | ETA ~{eta / 60:.0f} min] {message}", file=sys.stderr, flush=True)

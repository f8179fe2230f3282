"""Processes of a run, from /proc: who they are, how much CPU they used, how much memory they hold.

Classes: the driver (the eos Python process), the Spark JVM, Spark's Python workers (the
pyspark.daemon processes and the workers they fork), the Kafka broker, and everything else on
the machine (other engineers' tests share it). CPU is what tells where a run's time went
across process boundaries; py-spy (bench/profiling.py) then says where inside Python.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from eos_ops.jvm import split_stat

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
CLASSES = ("driver", "spark_jvm", "python_workers", "broker", "tools")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: str
    cpu_ticks: int  # utime + stime
    children_ticks: int  # cutime + cstime: children it waited for (e.g. Python processes the JVM ran)
    rss_kib: int


def _read(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    _, fields = split_stat(stat)
    ppid = int(fields[1])
    ticks = int(fields[11]) + int(fields[12])
    children = int(fields[13]) + int(fields[14])
    rss = int(fields[21]) * PAGE_KIB
    return ProcInfo(pid, ppid, cmdline, ticks, children, rss)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    info = _read(pid)
    if info is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return info.cpu_ticks / CLK_TCK


def snapshot() -> dict[int, ProcInfo]:
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read(int(entry))
            if info is not None:
                procs[info.pid] = info
    return procs


def descendants(root: int, procs: dict[int, ProcInfo]) -> set[int]:
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def classify(driver: int, broker: int | None, procs: dict[int, ProcInfo]) -> dict[int, str]:
    """pid -> class, for the driver's process tree and the broker."""
    classes = {driver: "driver"} if driver in procs else {}
    for pid in descendants(driver, procs):
        cmd = procs[pid].cmdline
        # eos.runnerforks: the fork server and the source runners it forked (they keep its cmdline)
        if any(name in cmd for name in ("pyspark.daemon", "pyspark.worker", "pyspark/daemon", "eos.runnerforks")):
            classes[pid] = "python_workers"
        elif "java" in cmd.split(" ")[0] and ("SparkSubmit" in cmd or "CoarseGrainedExecutorBackend" in cmd):
            classes[pid] = "spark_jvm"  # local mode: driver and executor; a cluster: its driver and executors
        elif "cluster_app.py" in cmd:
            classes[pid] = "driver"  # the cluster section's submitted eos driver (Python)
        elif "python" in cmd.split(" ")[0] and "SparkSubmit" in getattr(procs.get(procs[pid].ppid), "cmdline", ""):
            classes[pid] = "python_workers"  # a Python process the JVM started directly (planner workers)
        else:
            classes[pid] = "tools"
    if broker is not None and broker in procs:
        classes[broker] = "broker"
    return classes


# HotSpot's JIT compiler threads ("C1 CompilerThread0", cut to 15 characters by the kernel).
_JIT_THREAD = re.compile(r"C[12] CompilerThre")


def jit_ticks(pids: list[int]) -> dict[tuple[int, int], int]:
    """(pid, tid) -> CPU ticks of each JIT compiler thread of these JVMs."""
    out: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name, fields = split_stat(stat)
            if _JIT_THREAD.fullmatch(name):
                out[(pid, int(tid))] = int(fields[11]) + int(fields[12])
    return out


def _jvms(classes: dict[int, str]) -> list[int]:
    return [pid for pid, cls in classes.items() if cls == "spark_jvm"]


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class CpuMeter:
    """CPU seconds each class used between start() and stop()."""

    def __init__(self, driver: int, broker: int | None):
        self.driver, self.broker = driver, broker

    def start(self) -> None:
        self._before = snapshot()
        self._jit_before = jit_ticks(_jvms(classify(self.driver, self.broker, self._before)))
        self._machine_before = machine_busy_ticks()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        after = snapshot()
        classes = classify(self.driver, self.broker, after)
        jit_after = jit_ticks(_jvms(classes))
        busy_after, _ = machine_busy_ticks()
        wall = time.monotonic() - self._t0
        # Processes that existed before too are counted by their difference, new ones fully. A
        # process's exited children are counted where they belong: the JVM's are Python
        # processes it ran (the Python data source's planner runners), the driver's are tools.
        used: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
        for pid, cls in classes.items():
            before = self._before.get(pid)
            same = before is not None and before.cmdline == after[pid].cmdline
            own = after[pid].cpu_ticks - (before.cpu_ticks if same else 0)
            reaped = after[pid].children_ticks - (before.children_ticks if same else 0)
            used[cls] += max(0, own) / CLK_TCK
            reaped_cls = {"spark_jvm": "python_workers", "driver": "tools"}.get(cls, cls)
            used[reaped_cls] += max(0, reaped) / CLK_TCK
        ours = sum(used.values())
        machine = (busy_after - self._machine_before[0]) / CLK_TCK
        result = {k: round(v, 2) for k, v in used.items()}
        result["other"] = round(max(0.0, machine - ours), 2)
        # Part of spark_jvm, not added to it again: the JIT compiling the JVM's code while the run
        # went on (Spark plans every micro-batch anew, and its planner's code is compiled slowly:
        # bench/NOTES.md, 2026-11-25, evening). A lower bound: HotSpot may end an idle compiler
        # thread, and an ended thread's CPU is no longer listed per thread.
        jit = sum(max(0, t - self._jit_before.get(key, 0)) for key, t in jit_after.items())
        result["spark_jit"] = round(jit / CLK_TCK, 2)
        result["wall_s"] = round(wall, 2)
        result["cores"] = os.cpu_count() or 1
        return result


def pss_kib(pid: int) -> int:
    """Proportional set size (shared pages split between sharers): forked workers share most of
    their memory with the daemon, so summing RSS would count it several times."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    info = _read(pid)
    return info.rss_kib if info else 0


def memory_by_class(driver: int, broker: int | None) -> dict[str, dict[str, float]]:
    """Per class: RSS of the largest process, RSS summed, PSS summed (MiB), process count."""
    procs = snapshot()
    out: dict[str, dict[str, float]] = {}
    for pid, cls in classify(driver, broker, procs).items():
        if cls == "broker":
            continue
        entry = out.setdefault(cls, {"rss_max_mib": 0.0, "rss_sum_mib": 0.0, "pss_sum_mib": 0.0, "processes": 0})
        rss = procs[pid].rss_kib / 1024
        entry["rss_max_mib"] = max(entry["rss_max_mib"], rss)
        entry["rss_sum_mib"] += rss
        entry["pss_sum_mib"] += pss_kib(pid) / 1024
        entry["processes"] += 1
    return {k: {m: round(v, 1) for m, v in d.items()} for k, d in out.items()}


def spark_jvms(driver: int) -> list[int]:
    """The Spark JVMs of the driver's process tree (one in local mode)."""
    procs = snapshot()
    return sorted(pid for pid, cls in classify(driver, None, procs).items() if cls == "spark_jvm")


# G1's line in `jcmd PID GC.heap_info`: "garbage-first heap   total 262144K, used 123456K [0xf0.., 0x10..)"
# (JDK 17) or "total reserved 1048576K, committed 262144K, used 123456K [...)" (JDK 21+).
_HEAP = re.compile(
    r"heap\s+total (?:reserved \d+K, committed )?(?P<committed>\d+)K, used \d+K"
    r"\s*\[0x(?P<low>[0-9a-f]+),\s*0x(?P<high>[0-9a-f]+)\)"
)


_HISTOGRAM_TOTAL = re.compile(r"^Total\s+\d+\s+(?P<bytes>\d+)\s*$", re.MULTILINE)


def resident_kib(pid: int, low: int, high: int) -> int:
    """RSS of the process's mappings inside [low, high) (from /proc/PID/smaps)."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start < high and end > low
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def live_heap(pid: int, timeout_s: float = 60.0) -> dict[str, float] | None:
    """The JVM's live heap, from `jcmd PID GC.class_histogram` (a full collection, then the bytes of
    every object still reachable), what its heap has committed, and its memory outside the heap
    (its RSS minus the heap's resident pages: Arrow buffers, metaspace, threads, a RocksDB store). None
    when jcmd cannot attach or its output is not understood.

    Why: a JVM's RSS grows as G1 touches more of its heap, up to -Xmx, leak or not. The live heap
    grows only with what the program keeps, and the memory outside the heap only with native
    allocations. (`GC.run` then `GC.heap_info` would not do: the program allocates again in the
    half second between two jcmd calls, and "used" swung from 116 to 239 MiB on a flat run.)"""
    import subprocess

    try:
        histogram = subprocess.run(
            ["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=timeout_s
        )
        info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=timeout_s)
        total = _HISTOGRAM_TOTAL.search(histogram.stdout)
        heap = _HEAP.search(info.stdout)
        proc = _read(pid)
        if total is None or heap is None or proc is None:
            return None
        heap_rss = resident_kib(pid, int(heap["low"], 16), int(heap["high"], 16))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return {
        "live_mib": round(int(total["bytes"]) / 2**20, 1),
        "committed_mib": round(int(heap["committed"]) / 1024, 1),
        "outside_heap_mib": round((proc.rss_kib - heap_rss) / 1024, 1),
        "processes": 1,
    }


def worker_roots(driver: int) -> list[int]:
    """The pyspark.daemon processes the JVM started (py-spy follows the workers they fork)."""
    procs = snapshot()

    def is_daemon(pid: int) -> bool:
        return pid in procs and "pyspark.daemon" in procs[pid].cmdline

    return sorted(pid for pid in descendants(driver, procs) if is_daemon(pid) and not is_daemon(procs[pid].ppid))


class SampledCpuMeter:
    """CpuMeter for runs whose processes exit before the end (spark-submit's driver, executors):
    samples the process tree every `every_s` and keeps each process's last CPU ticks under the class
    it had while alive. (A process's CPU is otherwise only seen as its parent's reaped-children
    ticks: a cluster's executors would count as their Worker daemon's, the driver as this one's.)
    CPU of the last `every_s` of an exited process is missed."""

    def __init__(self, driver: int, broker: int | None, every_s: float = 0.5):
        import threading

        self.driver, self.broker, self.every_s = driver, broker, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cpu-sampler", daemon=True)
        self._seen: dict[int, tuple[str, str, int]] = {}  # pid -> (class, cmdline, last ticks)

    def _sample(self) -> None:
        procs = snapshot()
        for pid, cls in classify(self.driver, self.broker, procs).items():
            info = procs[pid]
            self._seen[pid] = (cls, info.cmdline, info.cpu_ticks)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def start(self) -> None:
        self._before = snapshot()
        self._machine_before = machine_busy_ticks()
        self._t0 = time.monotonic()
        self._sample()
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(5)
        self._sample()
        busy_after, _ = machine_busy_ticks()
        used: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
        for pid, (cls, cmdline, ticks) in self._seen.items():
            before = self._before.get(pid)
            same = before is not None and before.cmdline == cmdline
            used[cls] += max(0, ticks - (before.cpu_ticks if same else 0)) / CLK_TCK
        ours = sum(used.values())
        machine = (busy_after - self._machine_before[0]) / CLK_TCK
        result = {k: round(v, 2) for k, v in used.items()}
        result["other"] = round(max(0.0, machine - ours), 2)
        result["wall_s"] = round(time.monotonic() - self._t0, 2)
        result["cores"] = os.cpu_count() or 1
        return result

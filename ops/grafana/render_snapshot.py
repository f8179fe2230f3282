"""Render the Grafana dashboard with the data of a real run, as a static PNG (no Grafana needed).

    .venv/bin/python ops/grafana/render_snapshot.py            # -> docs/eos-dashboard.png

What it does, all real:
1. starts the embedded Kafka broker on a free port (or uses --bootstrap);
2. starts Prometheus (Debian: `apt-get install prometheus`) scraping the pipeline's driver
   every second;
3. runs a pipeline with `eos run --metrics-port` as a subprocess: JSON records with some
   poison ones (dead-letter queue), a steady input rate with a burst (lag), one failed epoch
   attempt (abort, recovery, replay), one slow epoch (an open transaction ages), and a foreign
   transaction left open on the sink topic for a while (a stuck last stable offset);
4. evaluates every panel's PromQL of ops/grafana/dashboards/eos-overview.json with Prometheus's
   query API ($pipeline -> the pipeline, $__rate_interval -> 15s) and draws the panels where
   the dashboard's grid puts them, with matplotlib.

Needs Java 17 (the broker), Prometheus, matplotlib (`pip install -e '.[snapshot]'`). Takes ~5 min.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DASHBOARD = ROOT / "ops/grafana/dashboards/eos-overview.json"
RATE_INTERVAL = "15s"
AVSC = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def say(message: str) -> None:
    print(f"[snapshot] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def pipeline_yaml(name: str, bootstrap: str, source: str, sink: str, dlq: str, checkpoint: Path) -> dict[str, Any]:
    return {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"mode": "exactly-once", "trigger": "1s", "slots": 2, "timeout": "30s"},
        "sources": [{
            "name": "clicks",
            "kafka": {"bootstrap": bootstrap, "topics": [source], "max_records_per_epoch": 1500},
            "key_format": "string",
            "value_format": {"type": "json", "schema": "click.avsc"},
            "on_error": "dlq",
            "dlq_topic": dlq,
        }],
        "transforms": [{"name": "counted", "sql": "SELECT _key AS key, upper(user) AS user, n FROM clicks"}],
        "sinks": [{
            "name": "out",
            "kafka": {"bootstrap": bootstrap, "topic": sink},
            "key": "key",
            "value": "concat(user, ':', cast(n AS string))",
            "value_format": "string",
        }],
    }  # fmt: skip


def feed(bootstrap: str, topic: str, stop: threading.Event, started: float) -> None:
    """~150 records/s, 1 in 200 poison, and a burst of 8000 at t=50s (the pipeline takes at most
    1500 an epoch, so lag builds up and drains)."""
    from eos_connectors.kafka.clients import producer

    out = producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    i, burst_done = 0, False
    while not stop.is_set():
        count = 15
        if not burst_done and time.monotonic() - started > 50:
            count, burst_done = 8000, True
        for _ in range(count):
            value = b"{oops" if i % 200 == 7 else json.dumps({"user": f"u{i % 331}", "n": i}).encode()
            out.produce(topic, value, f"k{i % 97}".encode())
            i += 1
        out.poll(0)
        stop.wait(0.1)
    out.flush(30)


def foreign_transaction(bootstrap: str, topic: str, stop: threading.Event, at_s: float, hold_s: float, t0: float):
    """Another producer's transaction left open on the sink topic: its LSO is stuck meanwhile."""
    from eos_connectors.kafka.clients import producer

    if stop.wait(max(0.0, t0 + at_s - time.monotonic())):
        return
    zombie = producer({"bootstrap.servers": bootstrap, "transactional.id": f"foreign-{topic}"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"foreign", b"x")
    zombie.flush(10)
    say(f"foreign transaction open on {topic} for {hold_s:.0f}s")
    stop.wait(hold_s)
    zombie.abort_transaction(30)


def start_prometheus(metrics_port: int, workdir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("prometheus is not installed (Debian: apt-get install prometheus)")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "eos", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(
        [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(workdir / "prometheus.log", "w"),  # noqa: SIM115
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    sys.exit(f"prometheus did not start; see {workdir / 'prometheus.log'}")


def run(args: argparse.Namespace, workdir: Path) -> tuple[str, str, float, float]:
    """Run the pipeline under load; returns (prometheus url, pipeline, start, end) with
    Prometheus still running (the caller stops it)."""
    from eos_connectors.kafka.clients import admin_client, create_topic

    bootstrap = args.bootstrap
    broker = None
    if bootstrap is None:
        from eos_ops.localkafka import LocalBroker
        from eos_ops.localkafka import free_port as broker_port

        broker = LocalBroker(port=broker_port(), data_dir=workdir / "broker")
        broker.start(progress=say)
        bootstrap = broker.bootstrap
    args.cleanup.append(lambda: broker and broker.stop())
    suffix = f"{int(time.time()) % 100000}"
    name, source, sink, dlq = f"clicks-{suffix}", f"clicks-in-{suffix}", f"clicks-out-{suffix}", f"clicks-dlq-{suffix}"
    admin = admin_client({"bootstrap.servers": bootstrap})
    for topic, partitions in ((source, 3), (sink, 2), (dlq, 1)):
        create_topic(admin, topic, partitions)
    (workdir / "click.avsc").write_text(json.dumps(AVSC))
    import yaml

    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline_yaml(name, bootstrap, source, sink, dlq, workdir / "ck"), sort_keys=False))

    metrics_port = free_port()
    prometheus, url = start_prometheus(metrics_port, workdir)
    args.cleanup.append(lambda: (prometheus.terminate(), prometheus.wait(20)))
    stop = threading.Event()
    started = time.monotonic()
    threads = [
        threading.Thread(target=feed, args=(bootstrap, source, stop, started), daemon=True),
        threading.Thread(target=foreign_transaction, args=(bootstrap, sink, stop, 170, 30, started), daemon=True),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    failpoints = [
        "--failpoint", "sink.after_precommit=raise@epoch=15,slot=1",  # an aborted attempt, retried
        "--failpoint", "sink.mid_produce=pause(20)@epoch=40,slot=0",  # a slow epoch: an open transaction ages
    ]  # fmt: skip
    log = open(workdir / "eos-run.log", "w")  # noqa: SIM115
    job = subprocess.Popen(
        [sys.executable, "-m", "eos", "run", str(path), "--metrics-port", str(metrics_port), *failpoints],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    args.cleanup.append(lambda: job.poll() is None and os.killpg(job.pid, signal.SIGKILL))
    for thread in threads:
        thread.start()
    t_start = time.time()
    say(f"running {name} for {args.duration:.0f}s (log {workdir / 'eos-run.log'}, prometheus {url})")
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline:
        if job.poll() is not None:
            sys.exit(f"eos run ended early ({job.returncode}); see {workdir / 'eos-run.log'}")
        time.sleep(1)
    stop.set()
    time.sleep(5)  # let the last input drain so the end of the plot shows the pipeline caught up
    t_end = time.time()
    os.killpg(job.pid, signal.SIGTERM)
    job.wait(120)
    return url, name, t_start, t_end


# ---------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------


def promql(expr: str, pipeline: str) -> str:
    return expr.replace("$pipeline", pipeline).replace("$__rate_interval", RATE_INTERVAL)


def query_range(url: str, expr: str, start: float, end: float, step: float = 2.0) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as response:
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def query_instant(url: str, expr: str, at: float) -> float | None:
    params = urllib.parse.urlencode({"query": expr, "time": at})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=30) as response:
        result = json.loads(response.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out or ", ".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"


def fetch(url: str, pipeline: str, start: float, end: float) -> dict[int, Any]:
    """Every panel's data: {panel id: [(legend, [t...], [v...]), ...] or a stat value}."""
    dashboard = json.loads(DASHBOARD.read_text())
    data: dict[int, Any] = {}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        if panel["type"] == "stat":
            data[panel["id"]] = query_instant(url, promql(panel["targets"][0]["expr"], pipeline), end)
            continue
        series = []
        for target in panel["targets"]:
            for result in query_range(url, promql(target["expr"], pipeline), start, end):
                points = [(float(t) - start, float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf")]
                if points:
                    name = legend(target.get("legendFormat", ""), result["metric"])
                    series.append((name, *zip(*points, strict=True)))
        data[panel["id"]] = series
    return data


def draw(data: dict[int, Any], pipeline: str, out: Path, duration: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    unit_h = 0.42
    fig = plt.figure(figsize=(22, rows * unit_h + 1.0), dpi=80, facecolor="#111217")
    fig.suptitle(f"{dashboard['title']} - pipeline {pipeline} (a real {duration:.0f} s run, Prometheus data)",
                 color="white", fontsize=15, x=0.01, ha="left", y=0.995)  # fmt: skip
    top = 1 - 0.8 / (rows * unit_h + 1.0)

    def box(grid: dict[str, int]) -> list[float]:
        height = top / rows
        x, w = grid["x"] / 24, grid["w"] / 24
        y = top - (grid["y"] + grid["h"]) * height
        return [x + 0.035 * w + 0.004, y + 0.45 * height, w * 0.93 - 0.008, grid["h"] * height - 1.3 * height]

    colors = plt.get_cmap("tab10").colors
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        if panel["type"] == "row":
            fig.text(0.005, top - (grid["y"] + 0.7) * top / rows, panel["title"], color="#8ab8ff", fontsize=12,
                     weight="bold")  # fmt: skip
            continue
        where = box(grid)
        if panel["type"] == "state-timeline":  # room for the phase names left of the axes
            where = [where[0] + 0.05, where[1], where[2] - 0.05, where[3]]
        ax = fig.add_axes(where, facecolor="#181b1f")
        ax.set_title(panel["title"], color="white", fontsize=10, loc="left")
        for spine in ax.spines.values():
            spine.set_color("#333")
        ax.tick_params(colors="#aaa", labelsize=7)
        value = data.get(panel["id"])
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        if panel["type"] == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            text = "-" if value is None else (f"{value:,.0f}" if unit != "s" else f"{value:.1f} s")
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            color = next((s["color"] for s in reversed(steps) if value is not None and (s["value"] is None
                          or value >= s["value"])), "green")  # fmt: skip
            ax.text(0.5, 0.42, text, ha="center", va="center", fontsize=22, color=color, weight="bold",
                    transform=ax.transAxes)  # fmt: skip
            continue
        if not value:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#777", transform=ax.transAxes)
            ax.set_xlim(0, duration)
            continue
        stacked = panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        if panel["type"] == "state-timeline":
            names = sorted({name for name, *_ in value})
            for i, (name, ts, _) in enumerate(sorted(value)):
                ax.scatter(ts, [names.index(name)] * len(ts), marker="|", s=120, color=colors[i % 10], label=name)
            ax.set_yticks(range(len(names)), names, fontsize=7, color="#ccc")
        elif stacked:
            import numpy as np

            grid_t = np.arange(0, duration + 1, 2.0)
            layers = [np.interp(grid_t, ts, vs, left=np.nan, right=np.nan) for _, ts, vs in value]
            ax.stackplot(grid_t, *[np.nan_to_num(layer) for layer in layers], labels=[n for n, *_ in value],
                         colors=colors[: len(value)], alpha=0.8)  # fmt: skip
        else:
            for i, (name, ts, vs) in enumerate(value):
                ax.plot(ts, vs, label=name, color=colors[i % 10], linewidth=1.2)
        ax.set_xlim(0, duration)
        ax.grid(color="#2a2d33", linewidth=0.5)
        if unit in ("s", "rps"):
            ax.set_ylabel({"s": "seconds", "rps": "per second"}[unit], color="#aaa", fontsize=7)
        ax.set_xlabel("seconds into the run", color="#777", fontsize=7)
        if panel["type"] != "state-timeline":
            ax.legend(fontsize=6.5, loc="upper left", ncol=3, facecolor="#181b1f", edgecolor="#333", labelcolor="#ddd")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())
    say(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting the embedded broker")
    parser.add_argument("--duration", type=float, default=210.0, help="seconds of load (210)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "eos-dashboard.png")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, TSDB)")
    args = parser.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("matplotlib is missing: pip install -e '.[snapshot]'")
    args.cleanup = []
    workdir = Path(tempfile.mkdtemp(prefix="eos-snapshot-"))
    try:
        url, pipeline, start, end = run(args, workdir)
        data = fetch(url, pipeline, start, end)
        draw(data, pipeline, args.out, end - start)
    finally:
        for step in reversed(args.cleanup):
            try:
                step()
            except Exception as exc:
                say(f"cleanup: {exc}")
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"kept {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

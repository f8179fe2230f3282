"""The driver's metrics page answers anyone who reaches it: it listens on loopback unless the
pipeline (`metrics: {host: ...}`) or `eos run --metrics-host` says otherwise."""

from __future__ import annotations

import socket
import subprocess
import sys

from prometheus_client import CollectorRegistry

from eos.config import parse_pipeline
from eos.observe.metrics import MetricsServer, start_metrics_server

PIPELINE = """
name: p
checkpoint: /tmp/never-written
sources: [{name: events, kafka: {bootstrap: "127.0.0.1:9092", topics: [t]}}]
sinks: [{name: out, kafka: {bootstrap: "127.0.0.1:9092", topic: o}}]
"""


def test_loopback_unless_told() -> None:
    assert parse_pipeline(PIPELINE).metrics.host == "127.0.0.1"
    told = parse_pipeline(PIPELINE + "metrics: {host: 0.0.0.0, port: 9400}\n").metrics
    assert (told.host, told.port) == ("0.0.0.0", 9400)
    server = start_metrics_server(CollectorRegistry(), 0)
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
    finally:
        server.close()


def test_the_printed_address_is_one_this_machine_reaches() -> None:
    assert MetricsServer("0.0.0.0", 9400, None, None).url == "http://127.0.0.1:9400/metrics"
    assert MetricsServer("10.0.0.5", 9400, None, None).url == "http://10.0.0.5:9400/metrics"
    assert MetricsServer("::", 9400, None, None).url == "http://[::1]:9400/metrics"


def test_eos_run_takes_a_metrics_host() -> None:
    shown = subprocess.run([sys.executable, "-m", "eos", "run", "--help"], capture_output=True, text=True, check=True)
    assert "--metrics-host" in shown.stdout

"""docker-compose.yml: no Docker engine runs here, so check everything that can be checked
without one: it parses, the cluster has the promised shape, every file a service mounts or
builds from exists, and no two services publish the same host port."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_cluster_shape(compose):
    services = compose["services"]
    brokers = {name: s for name, s in services.items() if s.get("image", "").startswith("apache/kafka:")}
    assert len(brokers) == 3, "three Kafka brokers from the official apache/kafka image"
    voters = {b["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for b in brokers.values()}
    assert len(voters) == 1, "all brokers agree on the KRaft quorum"
    voter_ids = {int(v.split("@")[0]) for v in voters.pop().split(",")}
    assert voter_ids == {int(b["environment"]["KAFKA_NODE_ID"]) for b in brokers.values()}
    for broker in brokers.values():
        env = broker["environment"]
        assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) <= len(brokers)
    commands = {name: " ".join(map(str, s.get("command", []))) for name, s in services.items()}
    assert any("deploy.master.Master" in c for c in commands.values()), "a Spark master"
    assert any("deploy.worker.Worker" in c for c in commands.values()), "a Spark worker"
    assert any(c.startswith("eos demo") for c in commands.values()), "a service running the demo job"
    assert any(s.get("image", "").startswith("prom/prometheus") for s in services.values())
    assert any(s.get("image", "").startswith("grafana/grafana") for s in services.values())


def test_mounted_and_built_files_exist(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
                assert source.startswith("./ops/"), f"{name}: service config belongs in ops/, not {source}"
        build = service.get("build")
        if build:
            dockerfile = ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
            assert dockerfile.exists(), f"{name} builds from missing {dockerfile}"
            for line in dockerfile.read_text().splitlines():
                if line.startswith("COPY "):
                    for src in line.split()[1:-1]:
                        assert (ROOT / build.get("context", ".") / src).exists(), f"{dockerfile}: COPY {src}"


def test_prometheus_and_grafana_files_resolve(compose):
    prometheus = yaml.safe_load((ROOT / "ops/prometheus/prometheus.yml").read_text())
    for rule_file in prometheus.get("rule_files", []):
        local = ROOT / "ops/prometheus" / Path(rule_file).relative_to("/etc/prometheus")
        assert local.exists(), f"prometheus.yml loads {rule_file}, missing as {local}"
        assert "groups" in yaml.safe_load(local.read_text())
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    services = compose["services"]
    for target in targets:
        host, port = target.split(":")
        assert host in services, f"Prometheus scrapes {host}, which is not a service"
        assert any(str(p).split(":")[-1] == port for p in services[host].get("ports", [])), target
    datasource = yaml.safe_load((ROOT / "ops/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"].startswith("http://prometheus:")


def test_host_ports_do_not_clash(compose):
    seen: dict[str, str] = {}
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            host_port = str(mapping).split(":")[0]
            assert re.fullmatch(r"\d+", host_port), f"{name}: publish ports as HOST:CONTAINER ({mapping})"
            assert host_port not in seen, f"host port {host_port} used by {seen.get(host_port)} and {name}"
            seen[host_port] = name


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_accepts_the_file():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("the docker compose plugin is not installed here; the other compose checks still ran")
    result = subprocess.run([*cli, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_metrics_endpoint_another_container_scrapes_listens_beyond_loopback(compose):
    """eos serves its metrics on 127.0.0.1 unless told otherwise: every target Prometheus scrapes
    must be a service started with --metrics-host 0.0.0.0 and that port."""
    scrape = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets
    for target in targets:
        service, port = target.rsplit(":", 1)
        command = [str(part) for part in compose["services"][service]["command"]]
        assert command[command.index("--metrics-port") + 1] == port, command
        assert command[command.index("--metrics-host") + 1] == "0.0.0.0", command

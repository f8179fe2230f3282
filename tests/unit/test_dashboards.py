"""The Grafana dashboards and Prometheus alert rules only use metrics eos exports.

The exported names come from the metrics module's own registry (never a hand-kept list), as
the series PromQL can select: counters as `_total`, histograms as `_bucket`/`_sum`/`_count`.
promtool checks and unit-tests the rules where it is installed (Debian: `apt-get install
prometheus`; .ci/run installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from eos.observe.metrics import PipelineMetrics, PipelineShape, series_names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "ops/grafana/dashboards").glob("*.json"))
PROMETHEUS = ROOT / "ops/prometheus"
# Series Prometheus itself adds to every scrape target (not eos's to export).
PROMETHEUS_OWN = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan", "Inf", "NaN"}  # fmt: skip


@pytest.fixture(scope="module")
def exported() -> set[str]:
    shape = PipelineShape("p", parallelism=2, sources=["a"], sinks=["out"], dlq_sources=["a"], skip_sources=["a"])
    return series_names(PipelineMetrics(shape).registry)


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)\b(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        names.add(name)
    return names


def test_the_extractor_finds_metrics_and_nothing_else():
    expr = (
        'histogram_quantile(0.95, sum by (le, phase) (rate(eos_x_bucket{pipeline=~"$pipeline"}[$__rate_interval])))'
        " / on (pipeline) group_left () clamp_min(eos_y_total offset 5m, 1) > bool 2"
        ' and time() - (eos_z > eos_w or eos_w) and up{job="eos"} == 0 unless sum(eos_v[10m:30s]) > 1e3'
    )
    assert metric_names(expr) == {"eos_x_bucket", "eos_y_total", "eos_z", "eos_w", "up", "eos_v"}


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel (rows included) and variable."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((panel.get("title", "?"), target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else (query or "")
        match = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*", query)
        if match:
            found.append((f"variable {variable['name']}", match.group(1)))
        elif query:
            found.append((f"variable {variable['name']}", query))
    return found


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def test_there_are_dashboards_and_rules():
    assert DASHBOARDS, "no dashboards in ops/grafana/dashboards"
    assert len(alert_rules()) >= 5


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_uses_only_exported_metrics(path: Path, exported: set[str]):
    dashboard = json.loads(path.read_text())
    queries = dashboard_queries(dashboard)
    assert queries, f"{path.name}: no queries"
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"{path.name}: panel {title!r} selects no metric: {expr}"
        unknown = names - exported - PROMETHEUS_OWN
        assert not unknown, f"{path.name}: panel {title!r} uses {sorted(unknown)}, which eos does not export"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed_for_provisioning(path: Path):
    dashboard = json.loads(path.read_text())
    datasource = yaml.safe_load((ROOT / "ops/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    ids: list[int] = []
    panels = dashboard["panels"]
    for panel in panels:
        ids.append(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"panel {panel['title']!r} is wider than the grid"
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid, f"panel {panel['title']!r}: unknown datasource"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert dashboard["uid"] and dashboard["title"]


def test_overview_dashboard_shows_what_operators_need():
    """Throughput, epoch latency by phase, commit and abort rates, lag, recoveries, lingering
    transactions: each has a panel, and the compose cluster opens this dashboard first."""
    path = ROOT / "ops/grafana/dashboards/eos-overview.json"
    used = set().union(*(metric_names(e) for _, e in dashboard_queries(json.loads(path.read_text()))))
    needed = {
        "throughput": {"eos_source_offsets_total", "eos_sink_records_total"},
        "latency by phase": {"eos_epoch_phase_duration_seconds_sum", "eos_epoch_phase_duration_seconds_bucket"},
        "commits and aborts": {"eos_epochs_committed_total", "eos_epoch_aborts_total", "eos_transaction_aborts_total"},
        "lag": {"eos_source_lag_offsets"},
        "recoveries": {"eos_recoveries_total", "eos_replayed_epochs_total"},
        "lingering transactions": {"eos_oldest_open_transaction_age_seconds", "eos_lingering_transaction_seconds"},
        "producers": {"eos_producer_leases_total", "eos_producer_pool_size", "eos_epoch_slots"},
        "takeover": {"eos_driver_fenced"},
    }
    for what, names in needed.items():
        assert names <= used, f"the overview dashboard lacks {what}: {sorted(names - used)}"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).name == path.name


def test_every_alert_rule_uses_only_exported_metrics(exported: set[str]):
    names = {rule["alert"] for rule in alert_rules()}
    required = {"EosNoCommittedEpoch", "EosEpochAbortsRepeated", "EosTransactionOpenTooLong", "EosLingeringTransaction",
                "EosSourceLagGrowing", "EosDeadLetterQueueNotEmpty", "EosDriverFenced"}  # fmt: skip
    assert required <= names, f"missing alerts: {sorted(required - names)}"
    for rule in alert_rules():
        used = metric_names(rule["expr"])
        assert used, f"alert {rule['alert']} selects no metric"
        unknown = used - exported - PROMETHEUS_OWN
        assert not unknown, f"alert {rule['alert']} uses {sorted(unknown)}, which eos does not export"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_observability_doc_lists_every_metric_and_no_other(exported: set[str]):
    doc = (ROOT / "docs/OBSERVABILITY.md").read_text()
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exported}
    listed = set(re.findall(r"^\| `(eos_\w+)` \|", doc, re.MULTILINE))
    assert listed == {n for n in exported if not n.endswith(("_bucket", "_sum", "_count"))} | {
        f for f in families if f"{f}_bucket" in exported
    }, f"the doc's metric tables differ from what eos exports: {sorted(listed ^ families)}"
    # Metrics named anywhere but in the list of what changed (which names the removed ones).
    current = re.sub(r"### Changes from .*?(?=\n## )", "", doc, flags=re.DOTALL)
    mentioned = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in re.findall(r"`(eos_[a-z_]+)`", current)}
    assert not mentioned - families, f"docs/OBSERVABILITY.md names metrics eos does not export: {mentioned - families}"
    alerts = {rule["alert"] for rule in alert_rules()}
    assert alerts <= set(re.findall(r"^\| `(Eos\w+)` \|", doc, re.MULTILINE)), "every alert rule is documented"


def test_promtool_checks_and_unit_tests_the_rules(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); the PromQL name checks above ran")
    checked = subprocess.run([promtool, "check", "rules", str(PROMETHEUS / "alerts.yml")], capture_output=True,
                             text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS, capture_output=True,
                            text=True)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # prometheus.yml names the rule file by its path inside the container; check it against ours.
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    config["rule_files"] = [str(PROMETHEUS / Path(f).name) for f in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    configured = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                                text=True)  # fmt: skip
    assert configured.returncode == 0, configured.stdout + configured.stderr

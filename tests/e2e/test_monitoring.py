"""The monitoring assets in deploy/monitoring/: the alert rules through promtool (check and unit tests), the
Prometheus config, the Kubernetes ServiceMonitor and PrometheusRule, the Grafana dashboard, and every series the
dashboard and the rules query found on a running mirror's /metrics.

Needs promtool (Debian's ``prometheus`` package; .ci/run installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mirror.layout import CacheLayout
from mirror.sync.record import record_run
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana" / "hf-mirror.json"
PROMETHEUS_RULE = MONITORING / "k8s" / "prometheusrule.yaml"
SERVICE_MONITOR = MONITORING / "k8s" / "servicemonitor.yaml"
# Labels Prometheus adds at scrape time, not the mirror.
TARGET_LABELS = {"job", "instance", "le"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; .ci/run does)")
    return path


def run_promtool(*args: str, cwd: Path = MONITORING) -> None:
    proc = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def rule_exprs() -> list[str]:
    return [r["expr"] for g in rule_groups() for r in g["rules"]]


def test_rules_pass_promtool_check():
    run_promtool("check", "rules", RULES.name)


def test_rules_unit_tests_pass():
    run_promtool("test", "rules", "alerts.test.yml")


def test_prometheus_config_checks(tmp_path):
    config = (MONITORING / "prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in config  # where the compose file mounts the rules
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/alerts.yml", str(RULES)))
    run_promtool("check", "config", "prometheus.yml", cwd=tmp_path)


def test_prometheusrule_holds_the_rules_file(tmp_path):
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == rule_groups()
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    run_promtool("check", "rules", "rules.yml", cwd=tmp_path)


def test_servicemonitor_selects_the_mirror_service():
    monitor = yaml.safe_load(SERVICE_MONITOR.read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    (selects,) = monitor["spec"]["selector"]["matchExpressions"]
    for path in ("k8s/service.yaml", "k8s-scale-out/base/service.yaml"):  # one node, and the fleet
        service = yaml.safe_load((ROOT / "deploy" / path).read_text())
        assert selects["operator"] == "In" and service["metadata"]["labels"][selects["key"]] in selects["values"]
        assert service["metadata"]["name"].startswith("hf-mirror")  # the job label: the rules' job=~"hf-mirror.*"
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    kust = yaml.safe_load((MONITORING / "k8s" / "kustomization.yaml").read_text())
    assert set(kust["resources"]) == {p.name for p in (MONITORING / "k8s").glob("*.yaml")} - {"kustomization.yaml"}


def test_dashboard_is_a_provisionable_grafana_dashboard():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "hf-mirror" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], target["expr"]
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in ("requests", "hit ratio", "bytes served", "latency", "upstream bytes", "fills", "quota", "sync"):
        assert topic in titles, topic
    provider = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "dashboards" / "hf-mirror.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    folder = provider["providers"][0]["options"]["path"]
    assert f"./deploy/monitoring/grafana/hf-mirror.json:{folder}/hf-mirror.json:ro" in grafana["volumes"]


# --- what the dashboard and the rules query, on a running mirror --------------------------------------------------


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """(metric name, label names it matches on) for each series selector of a mirror metric in a PromQL expression."""
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    for match in re.finditer(r"\b(hf_mirror[a-z0-9_:]*)\s*(\{([^}]*)\})?", expr):
        yield match.group(1), set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", match.group(3) or ""))


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


def test_every_series_queried_is_exported_by_a_running_mirror(emu, tmp_path):
    cache = tmp_path / "cache"
    # as a sync writes it
    record_run(CacheLayout(cache), str(tmp_path / "nightly.toml"), ok=True, files=1, size=1, failed=0)
    with MirrorProcess(emu.url, cache, "--max-size", "1GiB") as mirror:
        for path in ("/acme/tiny-model/resolve/main/config.json", "/acme/tiny-model/resolve/main/config.json",
                     "/api/models/acme/tiny-model", "/acme/tiny-model/resolve/main/nope.txt"):
            httpx.get(mirror.url + path)
        text = httpx.get(mirror.url + "/metrics").text
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    recorded = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    queried = [(expr, name, used) for expr in dashboard_exprs() + rule_exprs() for name, used in selectors(expr)]
    assert len({name for _, name, _ in queried}) >= 15
    for expr, name, used in queried:
        if ":" in name:  # a recording rule's series
            assert name in recorded, f"{name} is not recorded by alerts.yml ({expr})"
            continue
        assert name in labels, f"{name} is not on /metrics ({expr})"
        assert used - TARGET_LABELS <= labels[name], f"{name} has no label {used - labels[name]} ({expr})"

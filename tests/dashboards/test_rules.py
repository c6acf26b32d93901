"""The Prometheus rules: promtool accepts them, their unit tests pass, and they follow the naming rules and
reference only metrics that exist."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.dashboards import lint
from tests.dashboards.conftest import DASHBOARDS_DIR, RULES_FILE


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=DASHBOARDS_DIR)


def test_promtool_check_rules(promtool):
    result = _run(promtool, "check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests(promtool):
    tests = sorted(str(path) for path in (DASHBOARDS_DIR / "rules" / "tests").glob("*.yml"))
    assert tests
    result = _run(promtool, "test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


def test_rule_tests_cover_every_rule(rule_file):
    """Each alert is tested firing and quiet; each recording rule's value is checked."""
    tests_text = "\n".join(path.read_text() for path in (DASHBOARDS_DIR / "rules" / "tests").glob("*.yml"))
    for group in rule_file["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert tests_text.count(f"alertname: {rule['alert']}") >= 2, rule["alert"]
            else:
                assert f"expr: {rule['record']}" in tests_text, rule["record"]


def test_rules_follow_conventions_and_reference_real_metrics(rule_file):
    assert lint.lint_rules(rule_file) == []


def test_rule_lint_catches_mistakes():
    bad = {"groups": [{"name": "bad", "rules": [
        {"record": "overflow_rate", "expr": "sum(rate(moe_a2a_overflow_events_total[5m]))"},
        {"alert": "moe_a2a_overflow", "expr": "moe_a2a_overflow_events_total > 0"},
    ]}]}
    findings = "\n".join(lint.lint_rules(bad))
    assert "not level:metric:operations" in findings
    assert "not CamelCase" in findings
    assert "severity" in findings and "summary and description" in findings
    assert "not inside rate/irate/increase" in findings


@pytest.mark.parametrize("good, bad, alert", [
    # A saturating alert at 0.8 would fire for the quiet 0.85 group.
    ("ep_group_dispatcher:moe_a2a_runtime_tokens_window_utilization_ratio:max > 0.9",
     "ep_group_dispatcher:moe_a2a_runtime_tokens_window_utilization_ratio:max > 0.8", "MoeA2ACapSaturating"),
    # The sampled last-interval peak misses spikes: an alert on it fires where the window gauge saw one.
    ("ep_group_dispatcher:moe_a2a_runtime_tokens_window_utilization_ratio:max > 0.9",
     "ep_group_dispatcher:moe_a2a_interval_peak_utilization_ratio:max > 0.9", "MoeA2ACapSaturating"),
    # Reading only the instant value, over-provisioning ignores a peak no evaluation happened to read.
    ("max by (ep_group, dispatcher) (max_over_time(moe_a2a_runtime_tokens_window_utilization_ratio[10m])) < 0.5",
     "ep_group_dispatcher:moe_a2a_runtime_tokens_window_utilization_ratio:max < 0.5", "MoeA2ACapOverProvisioned"),
    # Without the join on moe_a2a_info the alert cannot say which variable to raise (FlashInfer's or DeepEP's).
    ("* on (ep_group, dispatcher) group_left (cap_variable)", "* on (ep_group, dispatcher) group_left ()",
     "MoeA2ACapSaturating"),
    # Counting auth failures as rejections would fire the rejected alert for a wrong token.
    ("increase(moe_a2a_reports_rejected_total[10m])",
     "increase({__name__=~\"moe_a2a_reports_rejected_total|moe_a2a_report_auth_failures_total\"}[10m])",
     "MoeA2AReportsRejected"),
])
def test_promtool_rule_tests_fail_when_an_alert_misbehaves(promtool, tmp_path, good, bad, alert):
    """The rule tests can fail: each broken variant of a rule is caught by its test."""
    rules = RULES_FILE.read_text()
    assert good in rules
    (tmp_path / "capwatch.rules.yml").write_text(rules.replace(good, bad, 1))
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "alerts.test.yml"
    test_file.write_text((DASHBOARDS_DIR / "rules" / "tests" / "alerts.test.yml").read_text())
    result = _run(promtool, "test", "rules", str(test_file))
    assert result.returncode != 0 and alert in result.stdout + result.stderr


def test_sample_prometheus_config_is_valid(promtool):
    result = _run(promtool, "check", "config", str(DASHBOARDS_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "capwatch.rules.yml" in result.stdout


def test_provisioning_files():
    providers = yaml.safe_load((DASHBOARDS_DIR / "provisioning" / "dashboards.yaml").read_text())
    datasources = yaml.safe_load((DASHBOARDS_DIR / "provisioning" / "datasources.yaml").read_text())
    assert providers["apiVersion"] == 1 and datasources["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    (datasource,) = datasources["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"].startswith("http")

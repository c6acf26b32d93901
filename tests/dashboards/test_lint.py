"""grafana/dashboard-linter's rules, reproduced, over the committed dashboards; and proof that each check
catches the mistake it exists for."""

from __future__ import annotations

import copy

import pytest

from tests.dashboards import lint


def test_committed_dashboards_are_lint_clean(committed_dashboards):
    assert committed_dashboards, "no dashboards under dashboards/grafana"
    findings = [finding for dashboard in committed_dashboards.values() for finding in lint.lint_dashboard(dashboard)]
    assert findings == []


def test_every_dashboard_query_and_variable_parses_with_promtool(committed_dashboards, promtool):
    expressions = []
    for dashboard in committed_dashboards.values():
        expressions += [lint.substitute_variables(target["expr"]) for _, target in lint.targets(dashboard)]
        expressions += [
            lint.substitute_variables(lint.variable_selector(variable["query"]))
            for variable in lint.query_variables(dashboard)
        ]
    assert len(expressions) > 30
    assert lint.promtool_parse_errors(expressions) == ""


def test_promtool_parse_check_rejects_broken_promql(promtool):
    errors = lint.promtool_parse_errors(["sum(rate(moe_a2a_tokens_sent_total[1m])", "up"])
    assert "expression_0" in errors and "parse error" in errors.lower()


def test_selector_walk_sees_context():
    found = lint.selectors(
        'histogram_quantile(0.99, sum by (cluster, le) (rate(moe_a2a_runtime_tokens_bucket{ep_rank=~"$ep_rank"}'
        '[$__rate_interval]))) / on (cluster) max by (cluster) (moe_a2a_cap_tokens)'
    )
    assert found == [
        lint.Selector("moe_a2a_runtime_tokens_bucket", "$__rate_interval", "rate"),
        lint.Selector("moe_a2a_cap_tokens", None, "max"),
    ]


def _one_panel(dashboard: dict) -> dict:
    return next(panel for panel in lint.panels(dashboard) if panel["type"] == "timeseries")


MUTATIONS = {
    "missing unit": (lambda p, d: p["fieldConfig"]["defaults"].pop("unit"), "unit"),
    "missing description": (lambda p, d: p.pop("description"), "description"),
    "hard-coded datasource": (lambda p, d: p.update(datasource={"type": "prometheus", "uid": "abc123"}),
                              "does not use the datasource variable"),
    "graph panel": (lambda p, d: p.update(type="graph"), "deprecated graph panel"),
    "fixed rate window": (lambda p, d: p["targets"][0].update(
        expr='rate(moe_a2a_tokens_sent_total{cluster=~"$cluster"}[5m])'), "should use $__rate_interval"),
    "bare counter": (lambda p, d: p["targets"][0].update(expr="moe_a2a_tokens_sent_total"),
                     "not inside rate/irate/increase"),
    "counter under the wrong function": (lambda p, d: p["targets"][0].update(
        expr="max_over_time(moe_a2a_overflow_events_total[$__rate_interval])"), "not inside rate/irate/increase"),
    "unknown metric": (lambda p, d: p["targets"][0].update(expr="moe_a2a_tokens_sent"), "neither in"),
    "no legend": (lambda p, d: p["targets"][0].update(legendFormat="__auto"), "needs a legend"),
    "per-rank series without the rank in the legend": (lambda p, d: p["targets"][0].update(
        expr='moe_a2a_cap_tokens{cluster=~"$cluster", dispatcher=~"$dispatcher", ep_rank=~"$ep_rank"}',
        legendFormat="{{cluster}}"), "needs the rank in its legend"),
    "variable not refreshed on time change": (
        lambda p, d: lint.query_variables(d)[0].update(refresh=1), "refresh on time range change"),
    "variable without All = .+": (lambda p, d: lint.query_variables(d)[0].update(allValue=".*"), "'.+'"),
    "variable on a fixed datasource": (
        lambda p, d: lint.query_variables(d)[0].update(datasource={"uid": "abc123"}), "does not query $datasource"),
    "no datasource variable": (lambda p, d: d["templating"]["list"].pop(0), "datasource variable"),
    "editable": (lambda p, d: d.update(editable=True), "must not be editable"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_lint_catches(mutation, committed_dashboards):
    dashboard = copy.deepcopy(next(iter(committed_dashboards.values())))
    mutate, expected = MUTATIONS[mutation]
    mutate(_one_panel(dashboard), dashboard)
    findings = lint.lint_dashboard(dashboard)
    assert any(expected in finding for finding in findings), findings

"""The committed dashboard JSON is exactly what the generator produces now."""

from __future__ import annotations

import json
import re

import pytest

from capwatch.dashboards import generate

from tests.dashboards import lint
from tests.dashboards.conftest import GRAFANA_DIR
from tests.support import launcher


def test_committed_json_is_current():
    stale = generate.stale_files(GRAFANA_DIR)
    assert not stale, f"stale dashboard JSON {stale}: run `python -m capwatch.dashboards.generate` and commit the result"


def test_every_generated_dashboard_is_committed_and_nothing_else():
    assert sorted(path.name for path in GRAFANA_DIR.glob("*.json")) == sorted(generate.DASHBOARDS)


def test_stale_json_is_detected_and_regenerated(tmp_path):
    """--check fails on an edited file and passes after the generator rewrote it."""
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.stale_files(tmp_path) == []
    target = tmp_path / "ep-group-overview.json"
    edited = json.loads(target.read_text())
    edited["panels"][1]["title"] = "hand edited"
    target.write_text(json.dumps(edited))
    assert generate.stale_files(tmp_path) == ["ep-group-overview.json"]
    check = launcher.run("-m", "capwatch.dashboards.generate", "--check", "--out", str(tmp_path), timeout_s=60)
    assert check.returncode == 1 and "stale" in check.stderr
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.stale_files(tmp_path) == []


def test_dashboards_cover_the_issue():
    """The panels the issue asks for exist (by title) and the heatmap reads the R histogram."""
    overview = json.loads(generate.render(generate.DASHBOARDS["ep-group-overview.json"]))
    detail = json.loads(generate.render(generate.DASHBOARDS["ep-rank-detail.json"]))
    overview_titles = {panel["title"] for panel in overview["panels"]}
    detail_titles = {panel["title"] for panel in detail["panels"]}
    assert {
        "Group max utilization", "Overflow rate by kind and outcome", "Workspace bytes per rank",
        "Workspace bytes across the group", "Cap: current vs recommended", "Forward steps per second",
        "Consistency findings", "Ranks reporting / missing",
    } <= overview_titles
    assert {
        "Local batch per rank vs the group's R", "Rank driving the peak", "Group peak utilization",
        "R distribution", "Tokens sent per rank", "Tokens received per rank", "Overflow events by kind and outcome",
    } <= detail_titles
    # Per rank means per rank: each rank's own line is its local batch; R is one line per group.
    per_rank = next(panel for panel in detail["panels"] if panel["title"] == "Local batch per rank vs the group's R")
    exprs = [target["expr"] for target in per_rank["targets"]]
    assert "moe_a2a_local_tokens_window_max" in exprs[0] and "by (" not in exprs[0]
    assert exprs[1].startswith("max by (ep_group, dispatcher)") and "moe_a2a_runtime_tokens_window_max" in exprs[1]
    heatmap = next(panel for panel in detail["panels"] if panel["type"] == "heatmap")
    assert heatmap["targets"][0]["format"] == "heatmap"
    assert "moe_a2a_runtime_tokens_bucket" in heatmap["targets"][0]["expr"]
    assert [v["name"] for v in overview["templating"]["list"]] == ["datasource", "ep_group", "dispatcher", "ep_rank"]


def _contained(part: object, whole: object, path: str = "") -> list[str]:
    """Paths where ``part`` is not contained in ``whole`` (dict keys may be extra in ``whole``)."""
    if isinstance(part, dict) and isinstance(whole, dict):
        return [missing for key, value in part.items()
                for missing in ([f"{path}/{key}"] if key not in whole else _contained(value, whole[key], f"{path}/{key}"))]
    if isinstance(part, list) and isinstance(whole, list) and len(part) == len(whole):
        return [missing for index, (a, b) in enumerate(zip(part, whole)) for missing in _contained(a, b, f"{path}/{index}")]
    return [] if part == whole else [path]


IMPORT_ENVELOPE = ("__inputs", "__requires")  # Grafana's export envelope around a dashboard, not the dashboard's


def test_committed_json_loads_into_the_grafana_schema_models(committed_dashboards):
    """The SDK's schema models (generated from Grafana's own schema) read every field back unchanged;
    they only add defaults (e.g. table and heatmap ``fieldConfig.defaults.custom``)."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    def unknown_fields(raw: dict) -> list[str]:
        dashboard = {key: value for key, value in raw.items() if key not in IMPORT_ENVELOPE}
        return _contained(dashboard, json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder)))

    plugins.register_default_plugins()
    for name, raw in committed_dashboards.items():
        assert unknown_fields(raw) == [], name
    misspelled = json.loads(json.dumps(next(iter(committed_dashboards.values()))))
    misspelled["panels"][1]["fieldconfig"] = misspelled["panels"][1].pop("fieldConfig")
    assert unknown_fields(misspelled) == ["/panels/1/fieldconfig"]


def test_an_installed_capwatch_writes_only_where_it_is_told(tmp_path, monkeypatch, capsys):
    """Outside a checkout the default folder is inside the package: writing needs --out, and nothing is written."""
    monkeypatch.setattr(generate, "IN_CHECKOUT", False)
    before = {path: path.read_text() for path in GRAFANA_DIR.glob("*.json")}
    with pytest.raises(SystemExit) as exit_info:
        generate.main([])
    assert exit_info.value.code == 2 and "--out DIR is needed" in capsys.readouterr().err
    assert {path: path.read_text() for path in GRAFANA_DIR.glob("*.json")} == before
    assert generate.main(["--out", str(tmp_path)]) == 0 and generate.stale_files(tmp_path) == []
    assert generate.main(["--check"]) == 0  # reading the shipped JSON needs no --out


def test_annotations_mark_overflows_cap_changes_and_restarts(committed_dashboards):
    """Every dashboard carries the three annotations, narrowed by the variables, on $datasource."""
    for name, dashboard in committed_dashboards.items():
        found = {item["name"]: item for item in lint.annotation_queries(dashboard)}
        assert set(found) == {"Overflows", "Cap changes", "Restarts"}, name
        assert "moe_a2a_overflow_events_total" in found["Overflows"]["expr"]
        assert found["Cap changes"]["expr"].startswith("changes(moe_a2a_cap_tokens{")
        assert found["Restarts"]["expr"].startswith("resets(moe_a2a_forward_steps_total{")
        assert all('ep_group=~"$ep_group"' in item["expr"] and item["datasource"]["uid"] == "${datasource}"
                   and item["enable"] for item in found.values())


def test_import_asks_for_the_prometheus_and_the_dashboard_keeps_its_uid(committed_dashboards):
    """What Grafana's import does with the envelope: every ${DS_...} names a declared input; replaced by the chosen
    datasource's uid, it becomes the datasource variable's starting value, and the panels still query $datasource.
    __requires names every panel type the dashboard uses."""
    uids = set()
    for name, dashboard in committed_dashboards.items():
        inputs = {item["name"]: item for item in dashboard["__inputs"]}
        assert list(inputs) == ["DS_PROMETHEUS"] and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus", name
        text = json.dumps(dashboard)
        assert set(re.findall(r"\$\{(DS_[A-Z_]+)\}", text)) == set(inputs), name
        imported = json.loads(text.replace("${DS_PROMETHEUS}", "prom-uid-1"))
        (variable,) = [item for item in imported["templating"]["list"] if item["type"] == "datasource"]
        assert variable["current"]["value"] == "prom-uid-1"
        assert all(target["datasource"]["uid"] == "${datasource}" for _, target in lint.targets(imported))
        required = {item["id"] for item in dashboard["__requires"] if item["type"] == "panel"}
        assert required == {panel["type"] for panel in lint.panels(dashboard)}, name
        assert {"grafana", "prometheus"} <= {item["id"] for item in dashboard["__requires"]}
        uids.add(dashboard["uid"])
    assert len(uids) == len(committed_dashboards) and all(uids)  # a fixed uid each: a re-import replaces it

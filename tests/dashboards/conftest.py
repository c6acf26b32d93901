"""Shared fixtures of the dashboard tests: the committed dashboards and rules, and the tools they need."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.support.checkout import REPO_ROOT

DASHBOARDS_DIR = REPO_ROOT / "dashboards"
GRAFANA_DIR = DASHBOARDS_DIR / "grafana"
RULES_FILE = DASHBOARDS_DIR / "rules" / "capwatch.rules.yml"


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not found on PATH: install the Debian 'prometheus' package (make system-deps)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _require("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _require("prometheus")


@pytest.fixture(scope="session")
def committed_dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(GRAFANA_DIR.glob("*.json"))}


@pytest.fixture(scope="session")
def rule_file() -> dict:
    return yaml.safe_load(RULES_FILE.read_text())

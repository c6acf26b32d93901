"""One TOML config file for the service (``capwatch serve --config``, ``CAPWATCH_CONFIG``): flags over the
environment over the file over the defaults; per-cluster advisor policy; ``--print-config`` prints what would run,
and reads back to the same settings; a mistake in the file is one line and starts nothing."""

from __future__ import annotations

import json
import tomllib

import pytest
from capwatch.service.config import Settings, load_settings, settings_toml
from capwatch.service.main import create_app
from fastapi.testclient import TestClient
from pydantic import ValidationError

from tests.service.conftest import JSON, T0, FakeClock
from tests.support.launcher import run_capwatch
from tests.support.simulate import SimulatedRank

CONFIG = """\
port = 8400
allowed_hosts = ["127.0.0.1", "capwatch.internal"]
retention_s = 86400

[advisor]
safety_margin = 0.2

[clusters.prod-a.advisor]
safety_margin = 0.3
target_percentile = 0.99
min_history_s = 3600

[clusters.cautious.advisor]
min_samples = 1000000
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "capwatch.toml"
    path.write_text(CONFIG)
    return path


def test_the_file_sets_and_the_environment_and_flags_win(config_file, monkeypatch):
    settings = load_settings(config_file)
    assert (settings.port, settings.retention_s, settings.allowed_hosts) == (8400, 86400, ["127.0.0.1",
                                                                                         "capwatch.internal"])
    assert settings.advisor.safety_margin == 0.2
    monkeypatch.setenv("CAPWATCH_PORT", "8500")
    monkeypatch.setenv("CAPWATCH_ADVISOR__SAFETY_MARGIN", "0.25")
    settings = load_settings(config_file)
    assert settings.port == 8500 and settings.advisor.safety_margin == 0.25 and settings.retention_s == 86400
    assert load_settings(config_file, port=8600).port == 8600


def test_each_cluster_gets_its_own_policy_over_the_global_one(config_file):
    settings = load_settings(config_file)
    prod = settings.advisor_for("prod-a")
    assert (prod.safety_margin, prod.target_percentile, prod.min_history_s) == (0.3, 0.99, 3600)
    assert prod.lower_percentile == settings.advisor.lower_percentile  # the rest is the global policy
    assert settings.advisor_for("anything-else") == settings.advisor
    assert Settings().advisor_for("prod-a") == Settings().advisor  # no file: one policy


@pytest.mark.parametrize("text, words", [
    ("prot = 8400\n", "unknown setting(s) prot"),
    ("[clusters.a.advisor]\nsafety_margn = 0.3\n", "unknown advisor setting(s) safety_margn"),
    ("[clusters.a.advisor]\nhalf_life_s = 60\n", "half_life_s shape the stored history of every cluster"),
    ("[clusters.a.advisor]\nbump_factor = 2\n", "bump_factor shape the stored history of every cluster"),
    ("[clusters.a.advisor]\nsafety_margin = -1\n", "clusters.a.advisor: safety_margin"),
    ("[clusters.a.advisor]\nmin_cap = 4096\nmax_cap = 1024\n", "clusters.a.advisor"),
    ("port = 70000\n", "port"),
    ("port = \n", "Invalid value"),
])
def test_a_mistake_in_the_file_is_refused_naming_it(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises((ValidationError, ValueError)) as error:
        load_settings(path)
    assert words in str(error.value)


def test_print_config_reads_back_to_the_same_settings(config_file, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPWATCH_TOKEN", "s3cret-token")
    settings = load_settings(config_file)
    printed = settings_toml(settings)
    assert "s3cret" not in printed and "# token is set (not shown" in printed
    parsed = tomllib.loads(printed)
    assert "token" not in parsed  # a placeholder read back would become a token anyone can guess
    assert parsed["clusters"]["prod-a"]["advisor"] == {"safety_margin": 0.3, "target_percentile": 0.99,
                                                       "min_history_s": 3600}
    printed_file = tmp_path / "printed.toml"
    printed_file.write_text(printed)
    monkeypatch.delenv("CAPWATCH_TOKEN")
    again = load_settings(printed_file)
    assert again.model_dump(exclude={"token"}) == settings.model_dump(exclude={"token"})


def test_the_cluster_policy_shapes_that_clusters_advice_only(tmp_path):
    """Two clusters with the same reports: the one whose policy asks for a million samples has too few."""
    path = tmp_path / "capwatch.toml"
    path.write_text(f'db_path = "{tmp_path / "capwatch.db"}"\nmaintenance_interval_s = 3600\n\n'
                    "[clusters.cautious.advisor]\nmin_samples = 1000000\n")
    clock = FakeClock()
    with TestClient(create_app(load_settings(path), clock=clock), base_url="http://localhost") as client:
        for cluster in ("cautious", "plain"):
            ranks = [SimulatedRank(cluster, rank, 2, cap=256) for rank in range(2)]
            for window in range(40):
                clock.now = T0 + 60 * window + 60
                for rank in ranks:
                    body = json.dumps(rank.report(T0 + 60 * window, T0 + 60 * window + 59, [200]))
                    assert client.post("/v1/reports", content=body, headers=JSON).status_code == 202
        plain = client.get("/v1/clusters/plain/advice").json()
        cautious = client.get("/v1/clusters/cautious/advice").json()
    assert plain["action"] != "insufficient_data", plain
    assert cautious["action"] == "insufficient_data", cautious


def test_serve_print_config_and_a_bad_file_on_the_command_line(config_file, tmp_path):
    printed = run_capwatch("serve", "--config", str(config_file), "--print-config", timeout_s=120)
    assert printed.returncode == 0, printed.stderr
    assert tomllib.loads(printed.stdout)["port"] == 8400
    with_env = run_capwatch("serve", "--print-config", timeout_s=120, env={"CAPWATCH_CONFIG": str(config_file)})
    assert tomllib.loads(with_env.stdout)["retention_s"] == 86400
    bad = tmp_path / "bad.toml"
    bad.write_text("prot = 1\n")
    refused = run_capwatch("serve", "--config", str(bad), timeout_s=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "unknown setting(s) prot" in refused.stderr and not (tmp_path / "capwatch.db").exists()
    missing = run_capwatch("serve", "--config", str(tmp_path / "nope.toml"), timeout_s=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr

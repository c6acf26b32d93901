"""A non-editable install must carry everything the product reads at run time, not only .py files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _data_files(folder: Path, patterns: tuple[str, ...]) -> set[str]:
    return {
        path.relative_to(REPO_ROOT).as_posix()
        for pattern in patterns
        for path in folder.glob(pattern)
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts
    }


def _source_copy(destination: Path) -> Path:
    """The files git would commit, copied: a build in the checkout reuses its stale build/ folder."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            check=True, capture_output=True, text=True).stdout.splitlines()
    for name in listed:
        source = REPO_ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def test_wheel_carries_dashboards_rules_and_web_assets(tmp_path):
    source = _source_copy(tmp_path / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = (tmp_path / "dist").glob("a2a_capwatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    expected = _data_files(REPO_ROOT / "dashboards", ("grafana/*.json", "provisioning/*.yaml", "rules/*.yml",
                                                      "rules/tests/*.yml", "prometheus.yml"))
    expected |= _data_files(REPO_ROOT / "service" / "web", ("**/*",))
    assert expected, "no data files found: the test would prove nothing"
    assert "dashboards/grafana/ep-group-overview.json" in expected
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks run-time files: {missing}"
    for package in ("capwatch", "dispatcher", "telemetry", "service", "dashboards"):
        assert f"{package}/__init__.py" in names
    assert not any(name.startswith("tests/") for name in names), "tests must not ship in the wheel"

"""``promtool check metrics`` on exposition text: the list of findings (empty when clean)."""

import shutil
import subprocess

import pytest


def promtool_findings(exposition: bytes) -> list[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run `make system-deps` (Debian package prometheus)")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    findings = (result.stdout + result.stderr).decode().strip().splitlines()
    if result.returncode not in (0, 3):
        pytest.fail(f"promtool failed (exit {result.returncode}): {findings}")
    assert (result.returncode == 3) == bool(findings), (result.returncode, findings)
    return findings

"""The real ``capwatch serve`` for tests and benchmarks: the product's one launcher
(``capwatch.demo.service``) started as ``tests.support.launcher`` starts every child, and the operator's install
of it (``.venv-service``: ``.[service]`` alone, non-editable, no torch; ``make test`` builds it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from capwatch.demo import service
from capwatch.demo.ports import free_port
from tests.support.checkout import REPO_ROOT
from tests.support.launcher import PYTHON, environment, outside_checkout

SERVICE_VENV = REPO_ROOT / ".venv-service"
INSTALLED_PYTHON = SERVICE_VENV / "bin" / "python"
# Skipped without .venv-service, unless make test requires it (then a missing venv fails the tests).
needs_service_venv = pytest.mark.skipif(
    not INSTALLED_PYTHON.exists() and not os.environ.get("CAPWATCH_REQUIRE_SERVICE_VENV"),
    reason="no .venv-service (make test builds it)")

__all__ = ["INSTALLED_PYTHON", "SERVICE_VENV", "ServiceProcess", "free_port", "needs_service_venv"]


class ServiceProcess(service.ServiceProcess):
    """``capwatch serve`` from outside the checkout (``cwd``, or the launcher's folder) with the launcher's
    environment: ``env`` on this process's (or alone, ``inherit_env=False``). ``python=INSTALLED_PYTHON`` serves
    the non-editable install."""

    def __init__(self, db_path: Path | str, port: int | None = None, extra_args: tuple[str, ...] = (),
                 env: Mapping[str, str] | None = None, log_path: Path | str | None = None, *,
                 python: Path | str = PYTHON, inherit_env: bool = True, cwd: Path | str | None = None):
        super().__init__(db_path, port, extra_args, environment(env, inherit=inherit_env), log_path, python=python,
                         inherit_env=False, cwd=outside_checkout(cwd))

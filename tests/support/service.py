"""The real ``capwatch serve`` for tests and benchmarks: the product's one launcher
(``capwatch.demo.service``) started as ``tests.support.launcher`` starts every child, and the operator's install
of it (``.venv-service``: ``.[service]`` alone, non-editable, no torch; ``make test`` builds it)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from capwatch.demo import service
from capwatch.demo.ports import free_port
from tests.support.checkout import PRODUCT_FOLDERS, REPO_ROOT, installed_path
from tests.support.launcher import PYTHON, environment, outside_checkout

SERVICE_VENV = REPO_ROOT / ".venv-service"
INSTALLED_PYTHON = SERVICE_VENV / "bin" / "python"
# Skipped without .venv-service, unless make test requires it (then a missing venv fails the tests).
needs_service_venv = pytest.mark.skipif(
    not INSTALLED_PYTHON.exists() and not os.environ.get("CAPWATCH_REQUIRE_SERVICE_VENV"),
    reason="no .venv-service (make test builds it)")

__all__ = ["INSTALLED_PYTHON", "SERVICE_VENV", "ServiceProcess", "free_port", "needs_service_venv",
           "require_current_install"]


@functools.cache
def install_differences() -> list[str]:
    """Where ``.venv-service``'s installed capwatch differs from the checkout's product files (empty: it is
    this checkout). ``make test`` reinstalls it; a plain ``pytest`` after editing the product does not."""
    site_packages = next(SERVICE_VENV.glob("lib/python3*/site-packages"), None)
    if site_packages is None:
        return [f"{SERVICE_VENV} has no site-packages"]
    differences = []
    checkout = {installed_path(str(path.relative_to(REPO_ROOT))): path
                for folder in PRODUCT_FOLDERS for path in (REPO_ROOT / folder).rglob("*")
                if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc")}
    installed = {str(path.relative_to(site_packages)): path for path in (site_packages / "capwatch").rglob("*")
                 if path.is_file() and "__pycache__" not in path.parts}
    for name, source in sorted(checkout.items()):
        copy = installed.get(name)
        if copy is None:
            if source.suffix == ".py":  # data files ship only where pyproject's package-data lists them
                differences.append(f"{name} is not installed")
        elif copy.read_bytes() != source.read_bytes():
            differences.append(f"{name} differs")
    differences += [f"{name} is installed but gone from the checkout" for name in sorted(installed)
                    if name.endswith(".py") and name not in checkout]
    return differences


def require_current_install() -> None:
    """Fail the test (not skip it) when ``.venv-service`` holds another version of the product than the
    checkout: its tests would pass or fail on code nobody is looking at."""
    differences = install_differences()
    if differences:
        pytest.fail(f"{SERVICE_VENV} is not this checkout's product ({len(differences)} file(s): "
                    f"{'; '.join(differences[:5])}); run `make service-venv`", pytrace=False)


class ServiceProcess(service.ServiceProcess):
    """``capwatch serve`` from outside the checkout (``cwd``, or the launcher's folder) with the launcher's
    environment: ``env`` on this process's (or alone, ``inherit_env=False``). ``python=INSTALLED_PYTHON`` serves
    the non-editable install."""

    def __init__(self, db_path: Path | str, port: int | None = None, extra_args: tuple[str, ...] = (),
                 env: Mapping[str, str] | None = None, log_path: Path | str | None = None, *,
                 python: Path | str = PYTHON, inherit_env: bool = True, cwd: Path | str | None = None):
        if Path(python) == INSTALLED_PYTHON:
            require_current_install()
        super().__init__(db_path, port, extra_args, environment(env, inherit=inherit_env), log_path, python=python,
                         inherit_env=False, cwd=outside_checkout(cwd))

"""The checkout the tests run from: its root, and the one name each of its Python files has.

The product's folders sit at the root and install as subpackages of ``capwatch`` (pyproject's setuptools
``package-dir``: ``service/`` is ``capwatch.service``); ``tests`` and ``benchmarks`` are never installed and
keep their own names. Standard library only: the one-name guard (``tests/support/one_name.py``) reads this
before anything else is imported.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# {"capwatch.service": "service", ...}: each installed package and the root folder it is built from.
PACKAGE_DIRS: dict[str, str] = tomllib.loads(
    (REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
PRODUCT_FOLDERS: dict[str, str] = {folder: package for package, folder in PACKAGE_DIRS.items()}
CHECKOUT_PACKAGES = ("tests", "benchmarks")  # run from the checkout, under their own names


def installed_path(repo_path: str) -> str:
    """``service/web/app.js`` -> ``capwatch/service/web/app.js``: where a product file lies in an install."""
    folder, _, rest = repo_path.partition("/")
    if folder not in PRODUCT_FOLDERS:
        raise ValueError(f"{repo_path} lies in no product folder (pyproject's package-dir: {sorted(PRODUCT_FOLDERS)})")
    return "/".join(filter(None, [PRODUCT_FOLDERS[folder].replace(".", "/"), rest]))


def module_name(location: str | Path) -> str | None:
    """The one name under which the module at ``location`` (a ``.py`` file or a package folder) may be
    imported: ``<root>/service/api/app.py`` -> ``capwatch.service.api.app``, ``<root>/tests/support`` ->
    ``tests.support``. None for anything else (outside the checkout, a virtual environment inside it)."""
    try:
        parts = list(Path(location).resolve().relative_to(REPO_ROOT).parts)
    except ValueError:
        return None
    if not parts or (parts[0] not in PRODUCT_FOLDERS and parts[0] not in CHECKOUT_PACKAGES):
        return None
    if parts[0] in PRODUCT_FOLDERS:
        parts[:1] = PRODUCT_FOLDERS[parts[0]].split(".")
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)

"""What each optional part of the install brings, and the one line a command prints when its part is missing.

``pip install a2a-capwatch`` (the base install) runs ``plan`` and ``advise``; ``serve`` needs the ``[service]``
extra and ``demo`` the ``[demo]`` extra (pyproject.toml). A command checks its extra before it does anything,
so a base install says what to install instead of ending in a ModuleNotFoundError after writing files."""

from __future__ import annotations

import importlib.util

from capwatch.usage_errors import CommandError

# The import names each extra brings that its commands need (pyproject.toml's optional-dependencies).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "starlette", "uvicorn", "httptools", "prometheus_client"),
    "demo": ("fastapi", "starlette", "uvicorn", "httptools", "prometheus_client", "torch", "numpy"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` this install lacks (found without importing them)."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require_extra(command: str, extra: str) -> None:
    """A ``CommandError`` naming the install command when ``extra``'s modules are missing."""
    missing = missing_modules(extra)
    if missing:
        torch_first = " (install the cluster's torch first)" if "torch" in missing else ""
        raise CommandError(f"`capwatch {command}` needs the [{extra}] extra, which this install lacks "
                           f"({', '.join(missing)}): pip install 'a2a-capwatch[{extra}]' from a wheel, or "
                           f"pip install '.[{extra}]' in a checkout{torch_first}")

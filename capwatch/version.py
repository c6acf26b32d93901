"""The version of the installed product: the one source for ``capwatch --version`` and the build-info
metric (the installed distribution's metadata, so a wheel, a checkout install and an editable install
each say what pip installed)."""

from __future__ import annotations

DISTRIBUTION = "a2a-capwatch"
UNKNOWN_VERSION = "0+unknown"  # run from a checkout that was never installed


def capwatch_version() -> str:
    """``a2a-capwatch``'s version as installed, or ``0+unknown`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN_VERSION

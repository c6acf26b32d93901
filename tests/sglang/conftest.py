"""The SGLang plugin against the released code of every verified sglang release, on CPU, in its own venv
(.venv-sglang) with each release's folders (tests/sglang/releases.py).

Skipped when that venv is absent, unless ``CAPWATCH_REQUIRE_SGLANG_VENV=1`` (``make test``), where a
missing venv is a failure.
"""

from __future__ import annotations

import os

import pytest

from tests.sglang import zygotes
from tests.sglang.ranks import sglang_missing

_missing = sglang_missing()
NEEDS_SGLANG = {"test_plugin.py", "test_releases.py", "test_logs.py", "test_deepep_dispatcher.py",
                "test_deepep_plugin.py", "test_mori_plugin.py", "test_sglang_dispatch_benchmark.py",
                "test_cap_report.py", "test_apply_releases.py",
                "test_flashinfer_unavailable.py", "test_deepep_unavailable.py",
                "test_flashinfer_megamoe_plugin.py", "test_megamoe_plugin.py",
                "test_megamoe_floor.py"}  # the others: pieces, main venv


def pytest_collection_modifyitems(config, items):
    if _missing is None:
        return
    if os.environ.get("CAPWATCH_REQUIRE_SGLANG_VENV") == "1":
        raise pytest.UsageError(f"CAPWATCH_REQUIRE_SGLANG_VENV=1 but {_missing}")
    skip = pytest.mark.skip(reason=_missing)
    for item in items:
        if item.fspath.basename in NEEDS_SGLANG:
            item.add_marker(skip)


@pytest.fixture(scope="package", autouse=True)
def rank_zygotes():
    """The zygotes the package's ranks forked from (zygotes.py), stopped after its last test."""
    yield
    zygotes.stop_all()

"""The torch-free parts of the dispatcher import without torch; the package's names still resolve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH_FREE = ("capwatch.dispatcher", "capwatch.dispatcher.sizing", "capwatch.dispatcher.vocabulary",
              "capwatch.dispatcher.models", "capwatch.dispatcher.workspace_plan", "capwatch.dispatcher.byte_units")


def _fresh_python(code: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_torch_free_modules_leave_torch_unloaded():
    loaded = _fresh_python(
        "import importlib, json, sys\n"
        f"for name in {TORCH_FREE!r}: importlib.import_module(name)\n"
        "from capwatch.dispatcher import sizing\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    assert loaded == []


def test_package_names_resolve_lazily_and_are_the_submodules_objects():
    resolved = _fresh_python(
        "import json, sys\n"
        "import capwatch.dispatcher as dispatcher\n"
        "before = 'torch' in sys.modules\n"
        "from capwatch.dispatcher import InstrumentedDispatcher, DispatchCounters, ROLES, CAP_ENV_VAR\n"
        "import capwatch.dispatcher.counters as counters, capwatch.dispatcher.instrumented as instrumented\n"
        "print(json.dumps({'before': before, 'after': 'torch' in sys.modules,\n"
        "  'same': [InstrumentedDispatcher is instrumented.InstrumentedDispatcher,\n"
        "           DispatchCounters is counters.DispatchCounters, ROLES is counters.ROLES],\n"
        "  'all': sorted(dispatcher.__all__), 'env': CAP_ENV_VAR}))"
    )
    assert resolved["before"] is False and resolved["after"] is True
    assert resolved["same"] == [True, True, True]
    assert resolved["env"] == "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def test_every_public_name_resolves_and_an_unknown_one_is_an_attribute_error():
    import capwatch.dispatcher as dispatcher

    for name in dispatcher.__all__:
        assert getattr(dispatcher, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        dispatcher.NoSuchThing  # noqa: B018

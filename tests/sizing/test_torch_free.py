"""The torch-free parts import without torch: sizing, the vocabulary, and the dispatcher package itself
(its modules that need torch are imported by name, never by the package)."""

from __future__ import annotations

import json
import pkgutil

import capwatch.sizing

from tests.support import launcher

TORCH_FREE = ("capwatch.vocabulary", "capwatch.dispatcher", "capwatch.sizing",
              *(f"capwatch.sizing.{module.name}" for module in pkgutil.iter_modules(capwatch.sizing.__path__)))


def test_torch_free_modules_leave_torch_unloaded():
    probe = ("import importlib, json, sys\n"
             f"for name in {TORCH_FREE!r}: importlib.import_module(name)\n"
             "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    completed = launcher.run("-c", probe, timeout_s=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == []
    assert len(TORCH_FREE) > 8  # every sizing module was found

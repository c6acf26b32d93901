"""scripts/gpu_check.py runs everywhere: without a GPU every check is a clean SKIP, exit 0."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: run the script itself")
def test_gpu_check_skips_every_check_cleanly_without_a_gpu(capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0
    printed = capsys.readouterr().out
    for name in module.CHECKS:
        assert f"SKIP {name}: no CUDA device" in printed

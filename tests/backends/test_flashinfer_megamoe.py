"""FlashInfer MegaMoE's pieces that need no SGLang: where the cap a rank runs comes from (0 = derived), the bytes read
from a built workspace, and what a server's log can and cannot say of it (the SGLang run itself:
tests/sglang/test_flashinfer_megamoe_plugin.py)."""

from __future__ import annotations

import pkgutil
import types
from dataclasses import dataclass, field

import pytest
import torch
from capwatch.backends.flashinfer_megamoe import RULES
from capwatch.sglang_plugin.hooks import flashinfer_megamoe as hook

from tests.sglang_logs.test_cli import LOG, T0, decode_lines, one_error_line, run_cli, traffic, write


@pytest.mark.parametrize("raw, resolved, derived, origin", [
    ("512", 512, 4096, f"{RULES.cap_env_var}=512"),
    ("0", 4096, 4096, f"derived by SGLang ({RULES.cap_env_var} is 0): cutedsl_moe_max_num_tokens() = 4096"),
    (None, 4096, 4096, f"derived by SGLang ({RULES.cap_env_var} is unset)"),
    ("0", 1024, 0, f"SGLang's fallback 1024 ({RULES.cap_env_var} is 0 and nothing to derive it from)"),
])
def test_the_cap_at_start_is_sglangs_resolution_and_says_where_it_came_from(monkeypatch, raw, resolved, derived,
                                                                            origin):
    names = {hook.RESOLVE_CAP.name: lambda: resolved, hook.DERIVED_CAP.name: lambda: derived}
    monkeypatch.setattr(pkgutil, "resolve_name", names.__getitem__)
    if raw is None:
        monkeypatch.delenv(RULES.cap_env_var, raising=False)
    else:
        monkeypatch.setenv(RULES.cap_env_var, raw)
    cap, words = hook.cap_at_start()
    assert cap == resolved and origin in words


@dataclass
class Frontend:
    staging: torch.Tensor
    compiled: dict = field(default_factory=dict)


@dataclass
class Workspace:
    x: torch.Tensor
    topk_idx: torch.Tensor
    frontend: Frontend
    roots: list = field(default_factory=list)
    back: object = None


def test_a_workspaces_bytes_are_its_storages_each_counted_once():
    root = torch.zeros(4096, dtype=torch.uint8)
    staging = torch.zeros(100, dtype=torch.bfloat16)
    workspace = Workspace(x=root[:1024], topk_idx=root[1024:2048].view(torch.int64),
                          frontend=Frontend(staging, {"views": [staging[:10], staging[50:]]}), roots=[root])
    workspace.back = workspace  # a cycle: walked once
    assert hook.tensor_bytes(workspace) == 4096 + 200
    assert hook.tensor_bytes(types.SimpleNamespace()) == 0


def test_the_layers_workspaces_are_its_default_one_and_every_capacity_profile():
    default, small, large = object(), object(), object()
    mega = types.SimpleNamespace(_workspace=default, _workspaces={
        256: types.SimpleNamespace(_backend_workspace=small), 4096: types.SimpleNamespace(_backend_workspace=large),
        8: types.SimpleNamespace(_backend_workspace=None)})
    assert hook.layer_workspaces(mega) == [default, small, large]
    assert hook.layer_workspaces(types.SimpleNamespace(_workspace=None, _workspaces={})) == []


def test_a_servers_log_has_no_size_for_it_so_the_log_reader_refuses_in_one_line(tmp_path):
    """A log shows the backend (its server_args) and SGLang's "FlashInfer MegaMOE is enabled" line; the cap only at
    DEBUG ("max_tokens_per_rank=T" when a layer is built) or in an overflow's MoEEpConfigError; the workspace's bytes
    never: the advice needs a rank's reports or series."""
    lines = LOG.start(T0 - 30, moe_a2a_backend=RULES.name) + decode_lines(LOG, traffic(30, lambda m, s, d: 100))
    one_error_line(run_cli("--sglang-log", write(tmp_path / "megamoe.log", lines)),
                   f"capwatch prices the {RULES.name} buffer from the bytes a rank reports")

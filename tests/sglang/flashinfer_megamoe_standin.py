"""The stand-in of the SGLang FlashInfer MegaMoE tests: ``flashinfer.moe_ep`` (its MegaMoE kernels need an SM100 GPU,
NVSHMEM and CuteDSL), from its released Python API (flashinfer-python 0.7.2, the release SGLang 0.5.23 pins:
``moe_ep/config.py``, ``modes/config.py``, ``modes/mega_layer.py``, ``tensors.py``, ``core/validation/common.py``).

- ``BootstrapConfig``, ``FleetParams`` (positive fields), ``MegaConfig``, ``DeepGemmMegaMoeConfig`` (no ``knobs``:
  SGLang drives it with the plain forward), ``MoEEpTensors`` (``num_tokens``), ``MoEEpConfigError(ValueError)``;
- ``MoEEpMegaLayer(bootstrap, fleet_params, weights, backend)``: ``forward(t, *, workspace=None,
  return_workspace_view=False)`` raises ``MoEEpConfigError("N tokens exceed max_tokens_per_rank=T")`` first, as
  0.7.2's does, then allocates its workspace lazily (``_ensure_workspace``, pooled across layers of one geometry as
  FlashInfer's ``workspace_pool`` does) and computes a stand-in MoE whose output depends on the tokens (each token
  scaled by its top-k weights' sum); the group's token counts cross the gloo group, as the kernel's dispatch does;
- the workspace: symmetric-heap tensors sized by a stand-in formula (``workspace_bytes``) — the tests check the
  plugin reports what the built workspace holds, not the formula.

``install()`` puts the package where SGLang imports it from (``flashinfer.moe_ep``).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

OVERFLOW_TEXT = "tokens exceed max_tokens_per_rank="


class MoEEpConfigError(ValueError):
    """Raised when an EP config field is out-of-range for the chosen backend."""


@dataclass(frozen=True)
class BootstrapConfig:
    world_size: int
    rank: int
    device: Any = None
    process_group: Any = None
    auto_bootstrap: bool = False


@dataclass(frozen=True)
class FleetParams:
    num_experts: int
    max_tokens_per_rank: int
    token_hidden_size: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("num_experts", "max_tokens_per_rank", "token_hidden_size", "dtype_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"FleetParams.{name} must be positive, got {getattr(self, name)}")


@dataclass
class MegaConfig:
    megakernel: object
    quantize_input: bool = True
    preprocess_weights: bool = True
    transformed_weights: Any = None


@dataclass(frozen=True)
class DeepGemmMegaMoeConfig:
    intermediate_size: int
    top_k: int
    activation_clamp: float | None = None


@dataclass
class MoEEpTensors:
    hidden_states: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    fc1_alpha: Any = None
    fc2_alpha: Any = None
    fc1_norm_const: Any = None
    output: Any = None

    @property
    def num_tokens(self) -> int:
        return self.hidden_states.shape[0]


def workspace_bytes(fleet: FleetParams, top_k: int, world_size: int) -> int:
    """A stand-in size: the staged fp8 tokens and scales, the routing, the receive pool and the bf16 output."""
    tokens, hidden = fleet.max_tokens_per_rank, fleet.token_hidden_size
    return tokens * (hidden + hidden // 32) + tokens * top_k * 12 + world_size * tokens * hidden + tokens * hidden * 2


@dataclass
class _SymmBuffer:
    """What a backend workspace holds: views into one symmetric byte buffer, as FlashInfer's are."""

    x: torch.Tensor
    topk_idx: torch.Tensor
    output: torch.Tensor
    _sym_roots: list = field(default_factory=list)


_POOL: dict[tuple, _SymmBuffer] = {}
ALLOCATED: list[_SymmBuffer] = []  # every workspace this process allocated (what a GPU's heap would hold)


def _allocate(fleet: FleetParams, top_k: int, world_size: int) -> _SymmBuffer:
    key = (fleet.num_experts, fleet.max_tokens_per_rank, fleet.token_hidden_size, top_k, world_size)
    if key not in _POOL:
        root = torch.zeros(workspace_bytes(fleet, top_k, world_size), dtype=torch.uint8)
        tokens, hidden = fleet.max_tokens_per_rank, fleet.token_hidden_size
        x = root[:tokens * hidden]
        topk_idx = root[tokens * hidden:tokens * hidden + tokens * top_k * 8].view(torch.int64)
        output = root[-tokens * hidden * 2:].view(torch.bfloat16)
        _POOL[key] = _SymmBuffer(x, topk_idx, output, [root])
        ALLOCATED.append(_POOL[key])
    return _POOL[key]


class MoEEpMegaLayer(nn.Module):
    def __init__(self, bootstrap: BootstrapConfig, fleet_params: FleetParams, weights, backend: MegaConfig):
        super().__init__()
        self._bootstrap = bootstrap
        self._fleet_params = fleet_params
        self._mega_config = backend
        self._megakernel_config = backend.megakernel
        self._workspace: Any = None
        self._workspaces: dict[int, Any] = {}
        self._default_workspace_handle = None
        self._transformed = backend.transformed_weights

    @property
    def supports_output_view(self) -> bool:
        return False

    def _ensure_workspace(self) -> Any:
        if self._workspace is None:
            self._workspace = _allocate(self._fleet_params, int(self._megakernel_config.top_k),
                                        self._bootstrap.world_size)
        return self._workspace

    def create_workspace(self, max_tokens_per_rank: int):
        raise NotImplementedError("the stand-in drives the default capacity only")

    def forward(self, t: MoEEpTensors, *, workspace=None, return_workspace_view: bool = False) -> torch.Tensor:
        fleet_params = self._fleet_params
        if t.num_tokens > fleet_params.max_tokens_per_rank:
            raise MoEEpConfigError(f"{t.num_tokens} {OVERFLOW_TEXT}{fleet_params.max_tokens_per_rank}")
        self._ensure_workspace()
        counts = torch.tensor([t.num_tokens], dtype=torch.int64)
        if self._bootstrap.world_size > 1:  # the kernel's dispatch: every rank learns what every rank sends
            dist.all_reduce(counts, group=self._bootstrap.process_group)
        scale = t.topk_weights.to(torch.float32).sum(dim=1, keepdim=True)
        return (t.hidden_states.to(torch.float32) * scale).to(torch.bfloat16)


def install() -> None:
    """``from flashinfer.moe_ep import ...`` finds the stand-in."""
    package, module = types.ModuleType("flashinfer"), types.ModuleType("flashinfer.moe_ep")
    for name in ("BootstrapConfig", "FleetParams", "MegaConfig", "DeepGemmMegaMoeConfig", "MoEEpTensors",
                 "MoEEpMegaLayer", "MoEEpConfigError"):
        setattr(module, name, globals()[name])
    package.moe_ep = module
    package.__path__, module.__path__ = [], []
    package.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer.moe_ep", None, is_package=True)
    sys.modules["flashinfer"], sys.modules["flashinfer.moe_ep"] = package, module

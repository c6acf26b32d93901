"""The stand-ins of the SGLang Mega MoE tests, for what needs a Blackwell GPU: DeepGEMM and the device's facts.

``deep_gemm`` (sgl-deep-gemm 0.2.3.post2, the release SGLang 0.5.23 pins), from its released Python API
(``deep_gemm/__init__.py``, ``deep_gemm/mega/__init__.py``):

- ``get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
  intermediate_hidden, num_shared_experts=0, use_fp8_dispatch=None, mma_type='fp8xfp4', activation='swiglu')``
  builds a ``SymmBuffer`` as DeepGEMM does: the cap aligned up (``_C.get_token_alignment_for_mega_moe()``), its
  attributes, one int8 ``buffer`` of ``_C.get_symm_buffer_size_for_mega_moe(...)`` bytes (here
  ``standin_num_bytes``: the tests compare what the plugin reports with what the buffer holds, never the
  formula), ``group.barrier()`` (construction is collective), and the views SGLang writes (``x``, ``x_sf``,
  ``topk_idx``, ``topk_weights``, ``x_scales``); every buffer a process builds is kept in ``SymmBuffer.built``;
- ``mega_moe_pre_dispatch(x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights,
  num_tokens, group_size, mma_type, buf_x_scales)`` copies the tokens and their routing into the buffer;
- ``fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, ...)`` writes each token's combined output: its
  experts here are 2 x the row, so y = 2 x the token x the sum of its routing weights;
- ``get_num_sms()`` / ``set_num_sms(n)``: the process-wide SM budget.

The device: SGLang's ``_device_sm`` (the GPU's compute capability, 0 on a CPU) set to a B200's 100 on
``layers/moe/mega_moe``, and ``torch.cuda.get_device_properties`` answering its 148 SMs; and the experts of a layer
whose Mega MoE weights SGLang built (``build_mega_moe_experts_weights`` transforms them with DeepGEMM on the GPU):
``experts(num_experts, layer_id)``, NVFP4 (the path through ``deep_gemm.mega_moe_pre_dispatch``).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import torch

TOKEN_ALIGNMENT = 8  # a stand-in for _C.get_token_alignment_for_mega_moe()
NUM_SMS = 148  # a B200's
DEVICE_SM = 100


def align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def standin_num_bytes(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                      intermediate_hidden: int) -> int:
    """A stand-in for DeepGEMM's compiled sizing, in the spirit of its layout (input tokens and routing, each
    expert's receive slots, the combine rows), 16-byte aligned."""
    tokens = align(num_max_tokens_per_rank, TOKEN_ALIGNMENT)
    per_token = hidden // 2 + hidden // 16 + num_topk * 12 + (num_topk + 1) * hidden * 2 + intermediate_hidden
    return align(4096 + num_experts * tokens * 4 + tokens * per_token * num_ranks, 16)


class SymmBuffer:
    built: list["SymmBuffer"] = []

    def __init__(self, group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, num_shared_experts: int = 0, mma_type: str = "fp8xfp4",
                 activation: str = "swiglu"):
        num_max_tokens_per_rank = align(num_max_tokens_per_rank, TOKEN_ALIGNMENT)
        self.group, self.num_experts, self.num_max_tokens_per_rank = group, num_experts, num_max_tokens_per_rank
        self.num_topk, self.hidden, self.intermediate_hidden = num_topk, hidden, intermediate_hidden
        self.num_shared_experts, self.mma_type, self.activation = num_shared_experts, mma_type, activation
        self.buffer = torch.zeros(standin_num_bytes(group.size(), num_experts, num_max_tokens_per_rank, num_topk,
                                                    hidden, intermediate_hidden), dtype=torch.int8)
        group.barrier()
        self.x = torch.zeros(num_max_tokens_per_rank, hidden, dtype=torch.bfloat16)  # the tokens, as sent
        self.x_sf = torch.zeros(num_max_tokens_per_rank, hidden // 16, dtype=torch.uint8)
        self.topk_idx = torch.zeros(num_max_tokens_per_rank, num_topk, dtype=torch.int64)
        self.topk_weights = torch.zeros(num_max_tokens_per_rank, num_topk, dtype=torch.float32)
        self.x_scales = torch.zeros(num_max_tokens_per_rank, dtype=torch.float32)
        SymmBuffer.built.append(self)


def get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                                 num_shared_experts=0, use_fp8_dispatch=None, mma_type="fp8xfp4",
                                 activation="swiglu"):
    if use_fp8_dispatch is not None:
        assert use_fp8_dispatch == (mma_type.split("x")[0] == "fp8")
    return SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                      num_shared_experts, mma_type=mma_type, activation=activation)


def mega_moe_pre_dispatch(x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, num_tokens,
                          group_size=32, mma_type="fp8xfp4", buf_x_scales=None, expert_scales=None):
    buf_x[:num_tokens].copy_(x[:num_tokens])
    buf_topk_idx[:num_tokens].copy_(topk_idx[:num_tokens])
    buf_topk_weights[:num_tokens].copy_(topk_weights[:num_tokens])


def fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights=None, shared_l2_weights=None,
                     cumulative_local_expert_recv_stats=None, recipe=(1, 1, 32), activation="swiglu",
                     activation_clamp=None, fast_math=True, **more):
    tokens = y.shape[0]
    weights = sym_buffer.topk_weights[:tokens].sum(1, keepdim=True)
    y.copy_((sym_buffer.x[:tokens].float() * 2 * weights).to(y.dtype))


_num_sms = [NUM_SMS]


def get_num_sms() -> int:
    return _num_sms[0]


def set_num_sms(num_sms: int) -> None:
    _num_sms[0] = num_sms


def install() -> types.ModuleType:
    """``deep_gemm`` importable (before the plugin checks it) as this stand-in."""
    module = types.ModuleType("deep_gemm")
    for name in ("SymmBuffer", "get_symm_buffer_for_mega_moe", "mega_moe_pre_dispatch", "fp8_fp4_mega_moe",
                 "get_num_sms", "set_num_sms"):
        setattr(module, name, globals()[name])
    sys.modules["deep_gemm"] = module
    return module


def install_device(mega_moe) -> None:
    """A B200 as far as SGLang's Mega MoE asks: its compute capability and its SM count."""
    mega_moe._device_sm = DEVICE_SM
    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(multi_processor_count=NUM_SMS)


def experts(num_experts: int, layer_id: int) -> SimpleNamespace:
    """A layer's experts with their Mega MoE weights built (NVFP4), as ``run_mega_routed_experts`` reads them."""
    return SimpleNamespace(num_experts=num_experts, layer_id=layer_id, _mega_moe_weights_built=True,
                           _mega_moe_nvfp4=True, _mega_moe_w4a4=False, _mega_moe_trtllm_layout=False,
                           mega_l1_weights=None, mega_l2_weights=None, mega_l1_alphas=None, mega_l2_alphas=None,
                           mega_l2_act_scales=None)

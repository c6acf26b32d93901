"""DeepEP v2's ``ElasticBuffer`` (``--moe-a2a-backend deepep_v2``): its cap's rules and its payload per token.

The buffer's bytes come from DeepEP's C++ (``_C.calculate_elastic_buffer_size``, which needs the NCCL
communicator of the group: the scale-up and scale-out domains, hybrid mode): nothing here can run it, so a rank
reports ``buffer.num_bytes`` of the buffer SGLang built (``sizing/reported.py``) and SGLang logs the same
number (``Initialized DeepEP v2 ElasticBuffer: ... num_bytes=N``). SGLang raises a ``ValueError`` naming the
variable when a rank's own batch is above the cap (``_DeepEPv2Impl._validate_common``) and refuses to start
below its floor (``validate_deepep_v2_dispatch_token_budget``: the per-rank prefill budget and the decode
CUDA-graph batch x tokens per request).
"""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.checks import SizingError, check_positive

SCALE_BLOCK_CHANNELS = 128  # one fp32 scale per 128 channels with FP8 dispatch; the hidden size must divide

DEEPEP_V2 = BackendCapRules(
    "deepep_v2", eager_prefill_dispatched=True, local_batch_cap=True,
    memory="ElasticBuffer", sized_by="the bytes its ElasticBuffer reported (num_bytes)",
    mismatch_hint="the buffer is rebuilt when the cap, the hidden size, top-k or FP8 dispatch change")


def check_hidden_size(hidden_size: int) -> int:
    """SizingError unless DeepEP v2 takes ``hidden_size`` (a multiple of its 128-channel scale blocks)."""
    check_positive("hidden_size", hidden_size)
    if hidden_size % SCALE_BLOCK_CHANNELS:
        raise SizingError(f"DeepEP v2 requires a hidden size that is a multiple of {SCALE_BLOCK_CHANNELS}, got "
                          f"{hidden_size}")
    return hidden_size


"""SGLang's side of each A2A backend's per-rank cap: the variable SGLang reads it from, its default when unset,
what SGLang's automatic ``--mem-fraction-static`` sets aside for the backend whatever the cap, SGLang's words in
its rules (what it asserts, what a batch past the cap does), the server arg that picks its kernel mode, SGLang's
own code for it (``sglang_engine/<backend>.py``: how SGLang allocates it) and how a plugin rank names its backend.
A backend's own rules (range, alignment, what happens past them) are its sizing module's ``BackendCapRules``;
``bind`` fills SGLang's facts into them, and the registry's specs carry the result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import ModuleType

from capwatch.sglang_engine import deepep, flashinfer
from capwatch.sizing.backends import BackendCapRules

# The default rule of a backend without a fixed default (FlashInfer's): max(the prefill, 4096)
# (overrides.py flashinfer_a2a_max_dispatch_tokens_per_rank).
DEFAULT_MIN_CAP = 4096


@dataclass(frozen=True)
class SGLangCap:
    variable: str  # envs.<variable>: where SGLang reads the per-rank cap from
    default_cap: int | None = None  # its default when unset (None: DEFAULT_MIN_CAP's rule)
    reserve_bytes: int | None = None  # set aside for the backend's buffers whatever the cap (None: nothing)
    rules: Mapping[str, object] = field(default_factory=dict)  # SGLang's facts in the backend's rules (why_max, ...)
    mode_setting: str | None = None  # the server arg that picks the backend's kernel mode (None: none)
    side: ModuleType | None = None  # SGLang's own code for the backend (sglang_engine/<backend>.py)
    # SGLang's start-up check of the cap, where it is the chunked prefill or the decode CUDA-graph batch, the larger,
    # on a server with chunked prefill that is not a decode server (arg_groups/moe_hook.py
    # required_pplx_dispatch_tokens_per_rank, the same in every verified release); False: another rule or none.
    start_check_prefill_or_decode_batch: bool = False


# _DeepEPv2Impl._validate_common: a rank's own batch above the cap.
DEEPEP_V2_OVERFLOW = ("SGLang raises a ValueError ('DeepEP v2 dispatch input exceeds the per-rank buffer capacity') "
                      "and the rank dies")

CAPS: dict[str, SGLangCap] = {
    "flashinfer": SGLangCap("SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK", rules=flashinfer.CAP_RULES,
                            side=flashinfer),
    # reserve_for_deepep_a2a_mb: 2 * 1024 MB, priced in SGLang's DeepEP plan (sglang_engine/deepep.py)
    "deepep": SGLangCap("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=128,
                        reserve_bytes=deepep.RESERVE_BYTES, rules=deepep.CAP_RULES,
                        mode_setting=deepep.MODE_SETTING, side=deepep),
    "deepep_v2": SGLangCap("SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=128,
                           rules=dict(overflow_outcome=DEEPEP_V2_OVERFLOW)),
    # Read raw (get_int_env_var), not through envs: token_dispatcher/mooncake.py _MooncakeEPDispatcherImpl.__init__
    "mooncake": SGLangCap("SGLANG_MOONCAKE_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=128),
    "nixl": SGLangCap("SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=128),
    # --deepep-mode picks MoRI's kernel too (low_latency: AsyncLL; auto becomes normal).
    "mori": SGLangCap("SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=4096,
                      mode_setting=deepep.MODE_SETTING),
    "pplx": SGLangCap("SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", default_cap=128,  # environ.py, pplx.py:224
                      start_check_prefill_or_decode_batch=True),
    # 0 (its default) = derived per rank: flashinfer_megamoe._resolve_max_tokens_per_rank (no fixed number)
    "flashinfer_megamoe": SGLangCap("SGLANG_FLASHINFER_MEGAMOE_MAX_TOKENS_PER_RANK"),
    "megamoe": SGLangCap("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", default_cap=8192),  # read per call
}


def bind(rules: BackendCapRules) -> BackendCapRules:
    """``rules`` with SGLang's variable, default, reserve, words, mode setting and own code for that backend's cap
    (a backend not in ``CAPS`` keeps what its rules say)."""
    cap = CAPS.get(rules.name)
    if cap is None:
        return rules
    return replace(rules, cap_env_var=cap.variable, default_cap=cap.default_cap, engine_reserve_bytes=cap.reserve_bytes,
                   mode_setting=cap.mode_setting, engine_side=None if cap.side is None else cap.side.__name__,
                   **cap.rules)


def reported_backend(rules: BackendCapRules) -> str:
    """The ``backend`` an SGLang plugin rank reports: the engine and SGLang's name of the A2A."""
    return f"sglang-{rules.name}"

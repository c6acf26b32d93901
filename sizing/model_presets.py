"""MoE geometry (hidden size, routed experts, top-k) of published models, plus custom geometry.

Each preset cites the config.json fields it comes from; ``docs/sizing.md`` lists where each was
checked. The three numbers that size the A2A workspace are kept, and the KV cache's bytes per token
(what a byte of workspace costs in KV-cache tokens, the trade an operator makes):

- MLA (DeepSeek, Kimi): one compressed latent per token and layer,
  ``(kv_lora_rank + qk_rope_head_dim) x num_hidden_layers x dtype bytes``;
- GQA: a key and a value per KV head, ``2 x num_key_value_heads x head_dim x layers x dtype bytes``,
  counting only the layers that keep every token (full attention; sliding-window and linear-attention
  layers hold a bounded state per request, not per token).

Per rank with DP attention (FlashInfer's A2A in SGLang 0.5.23 requires attn_tp_size 1): each rank holds
its own requests' whole KV, so a token costs the full amount on the rank that holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from capwatch.sizing.checks import SizingError
from capwatch.sizing.checks import check_positive as _positive

KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8": 1, "mxfp8": 1, "nvfp4": 0.5, "fp4_e2m1": 0.5}  # "auto": the model's bf16 weights


@dataclass(frozen=True)
class KVCacheGeometry:
    attention: str  # "MLA" or "GQA"
    values_per_token_per_layer: int  # MLA: kv_lora_rank + qk_rope_head_dim; GQA: 2 x kv heads x head_dim
    layers: int  # layers that keep every token
    source: str = ""

    def bytes_per_token(self, kv_cache_dtype: str | None = None) -> int:
        """Bytes one token of KV cache takes on the rank that holds it (``kv_cache_dtype`` as SGLang spells it)."""
        per_value = KV_DTYPE_BYTES.get((kv_cache_dtype or "auto").lower(), 2)
        return max(1, int(self.values_per_token_per_layer * self.layers * per_value))


def _mla(kv_lora_rank: int, qk_rope_head_dim: int, layers: int, source: str) -> KVCacheGeometry:
    return KVCacheGeometry("MLA", kv_lora_rank + qk_rope_head_dim, layers, source)


def _gqa(kv_heads: int, head_dim: int, layers: int, source: str) -> KVCacheGeometry:
    return KVCacheGeometry("GQA", 2 * kv_heads * head_dim, layers, source)


@dataclass(frozen=True)
class ModelGeometry:
    name: str  # the preset's canonical name, or "custom"
    hidden_size: int
    top_k: int  # routed experts per token
    num_experts: int  # routed experts (shared experts never travel through the A2A)
    source: str = ""
    kv_cache: KVCacheGeometry | None = None
    # config.json's n_shared_experts: the experts SGLang fuses into DeepEP's expert slots, one slot per rank
    # each, with --enforce-shared-experts-fusion (DeepSeek-family models only).
    shared_experts: int = 0

    def __post_init__(self) -> None:
        _positive("hidden_size", self.hidden_size)
        _positive("top_k", self.top_k)
        _positive("num_experts", self.num_experts)
        if self.top_k > self.num_experts:
            raise SizingError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if isinstance(self.shared_experts, bool) or not isinstance(self.shared_experts, int) or self.shared_experts < 0:
            raise SizingError(f"shared_experts must be an integer >= 0, got {self.shared_experts!r}")


def custom_geometry(hidden_size: int, top_k: int, num_experts: int, shared_experts: int = 0) -> ModelGeometry:
    return ModelGeometry("custom", hidden_size, top_k, num_experts, "given on the command line",
                         shared_experts=shared_experts)


_HF = "huggingface.co/{}/blob/main/config.json"

# canonical name -> geometry; aliases below.
MODEL_PRESETS: dict[str, ModelGeometry] = {
    geometry.name: geometry
    for geometry in (
        ModelGeometry("deepseek-v3", 7168, 8, 256, _HF.format("deepseek-ai/DeepSeek-V3")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok, n_shared_experts",
                      _mla(512, 64, 61, "kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 61"), 1),
        ModelGeometry("deepseek-r1", 7168, 8, 256, _HF.format("deepseek-ai/DeepSeek-R1")
                      + ": same architecture as DeepSeek-V3",
                      _mla(512, 64, 61, "kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 61"), 1),
        ModelGeometry("deepseek-v2", 5120, 6, 160, _HF.format("deepseek-ai/DeepSeek-V2")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok, n_shared_experts",
                      _mla(512, 64, 60, "kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 60"), 2),
        ModelGeometry("kimi-k2", 7168, 8, 384, _HF.format("moonshotai/Kimi-K2-Instruct")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok, n_shared_experts",
                      _mla(512, 64, 61, "kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 61"), 1),
        ModelGeometry("qwen3-235b-a22b", 4096, 8, 128, _HF.format("Qwen/Qwen3-235B-A22B")
                      + ": hidden_size, num_experts, num_experts_per_tok",
                      _gqa(4, 128, 94, "num_key_value_heads 4, head_dim 128, num_hidden_layers 94")),
        ModelGeometry("qwen3-30b-a3b", 2048, 8, 128, _HF.format("Qwen/Qwen3-30B-A3B")
                      + ": hidden_size, num_experts, num_experts_per_tok",
                      _gqa(4, 128, 48, "num_key_value_heads 4, head_dim 128, num_hidden_layers 48")),
        ModelGeometry("qwen3-next-80b-a3b", 2048, 10, 512, _HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct")
                      + ": hidden_size, num_experts, num_experts_per_tok",
                      _gqa(2, 256, 12, "num_key_value_heads 2, head_dim 256; full attention in 12 of 48 layers "
                                       "(full_attention_interval 4), the rest linear attention")),
        ModelGeometry("gpt-oss-120b", 2880, 4, 128, _HF.format("openai/gpt-oss-120b")
                      + ": hidden_size, num_local_experts, num_experts_per_tok",
                      _gqa(8, 64, 18, "num_key_value_heads 8, head_dim 64; full attention in 18 of 36 layers "
                                      "(layer_types alternate sliding_attention with window 128)")),
        ModelGeometry("gpt-oss-20b", 2880, 4, 32, _HF.format("openai/gpt-oss-20b")
                      + ": hidden_size, num_local_experts, num_experts_per_tok",
                      _gqa(8, 64, 12, "num_key_value_heads 8, head_dim 64; full attention in 12 of 24 layers "
                                      "(layer_types alternate sliding_attention with window 128)")),
        ModelGeometry("mixtral-8x7b", 4096, 2, 8, _HF.format("mistralai/Mixtral-8x7B-v0.1")
                      + ": hidden_size, num_local_experts, num_experts_per_tok",
                      _gqa(8, 128, 32, "num_key_value_heads 8, head_dim 128 (4096 / 32 heads), "
                                       "num_hidden_layers 32")),
    )
}

MODEL_ALIASES: dict[str, str] = {
    "deepseek-v3-0324": "deepseek-v3",
    "deepseek-r1-0528": "deepseek-r1",
    "kimi-k2-instruct": "kimi-k2",
    "kimi-k2-instruct-0905": "kimi-k2",
    "kimi-k2-base": "kimi-k2",
    "qwen3-235b": "qwen3-235b-a22b",
    "qwen3-30b": "qwen3-30b-a3b",
    "qwen3-next": "qwen3-next-80b-a3b",
    "qwen3-next-80b": "qwen3-next-80b-a3b",
    "mixtral": "mixtral-8x7b",
    "mixtral-8x7b-instruct": "mixtral-8x7b",
}


_SUFFIX = re.compile(r"-(instruct|thinking|base|chat|fp8|bf16|\d{4}|v\d+\.\d+)$")


def _candidates(name: str):
    """``"mistralai/Mixtral-8x7B-Instruct-v0.1"`` -> mixtral-8x7b-instruct-v0.1, mixtral-8x7b-instruct, ..."""
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-").replace(" ", "-")
    while True:
        yield key
        stripped = _SUFFIX.sub("", key)
        if stripped == key:
            return
        key = stripped


def known_model_names() -> list[str]:
    return sorted(MODEL_PRESETS)


def model_geometry(name: str) -> ModelGeometry:
    """The preset called ``name`` (case-insensitive; HF repo ids and common aliases work)."""
    for key in _candidates(name):
        canonical = MODEL_ALIASES.get(key, key)
        if canonical in MODEL_PRESETS:
            return MODEL_PRESETS[canonical]
    raise SizingError(
        f"unknown model {name!r}; known: {', '.join(known_model_names())} "
        "(or give --hidden-size, --top-k and --num-experts)"
    )


def preset_for_geometry(hidden_size: int, top_k: int, num_experts: int) -> ModelGeometry | None:
    """The preset a rank's reported MoE geometry matches (ranks report geometry, not names); None if
    none or several with different KV caches match."""
    matches: dict[KVCacheGeometry | None, ModelGeometry] = {}
    for geometry in MODEL_PRESETS.values():
        if (geometry.hidden_size, geometry.top_k, geometry.num_experts) == (hidden_size, top_k, num_experts):
            matches.setdefault(geometry.kv_cache, geometry)
    return next(iter(matches.values())) if len(matches) == 1 else None

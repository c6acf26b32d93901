"""MoE geometry (hidden size, routed experts, top-k) of published models, plus custom geometry.

Each preset cites the config.json fields it comes from; ``docs/sizing.md`` lists where each was
checked. Only the three numbers that size the A2A workspace are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from capwatch.dispatcher.sizing import SizingError, check_positive as _positive


@dataclass(frozen=True)
class ModelGeometry:
    name: str  # the preset's canonical name, or "custom"
    hidden_size: int
    top_k: int  # routed experts per token
    num_experts: int  # routed experts (shared experts never travel through the A2A)
    source: str = ""

    def __post_init__(self) -> None:
        _positive("hidden_size", self.hidden_size)
        _positive("top_k", self.top_k)
        _positive("num_experts", self.num_experts)
        if self.top_k > self.num_experts:
            raise SizingError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")


def custom_geometry(hidden_size: int, top_k: int, num_experts: int) -> ModelGeometry:
    return ModelGeometry("custom", hidden_size, top_k, num_experts, "given on the command line")


_HF = "huggingface.co/{}/blob/main/config.json"

# canonical name -> geometry; aliases below.
MODEL_PRESETS: dict[str, ModelGeometry] = {
    geometry.name: geometry
    for geometry in (
        ModelGeometry("deepseek-v3", 7168, 8, 256, _HF.format("deepseek-ai/DeepSeek-V3")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok"),
        ModelGeometry("deepseek-r1", 7168, 8, 256, _HF.format("deepseek-ai/DeepSeek-R1")
                      + ": same architecture as DeepSeek-V3"),
        ModelGeometry("deepseek-v2", 5120, 6, 160, _HF.format("deepseek-ai/DeepSeek-V2")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok"),
        ModelGeometry("kimi-k2", 7168, 8, 384, _HF.format("moonshotai/Kimi-K2-Instruct")
                      + ": hidden_size, n_routed_experts, num_experts_per_tok"),
        ModelGeometry("qwen3-235b-a22b", 4096, 8, 128, _HF.format("Qwen/Qwen3-235B-A22B")
                      + ": hidden_size, num_experts, num_experts_per_tok"),
        ModelGeometry("qwen3-30b-a3b", 2048, 8, 128, _HF.format("Qwen/Qwen3-30B-A3B")
                      + ": hidden_size, num_experts, num_experts_per_tok"),
        ModelGeometry("qwen3-next-80b-a3b", 2048, 10, 512, _HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct")
                      + ": hidden_size, num_experts, num_experts_per_tok"),
        ModelGeometry("gpt-oss-120b", 2880, 4, 128, _HF.format("openai/gpt-oss-120b")
                      + ": hidden_size, num_local_experts, num_experts_per_tok"),
        ModelGeometry("gpt-oss-20b", 2880, 4, 32, _HF.format("openai/gpt-oss-20b")
                      + ": hidden_size, num_local_experts, num_experts_per_tok"),
        ModelGeometry("mixtral-8x7b", 4096, 2, 8, _HF.format("mistralai/Mixtral-8x7B-v0.1")
                      + ": hidden_size, num_local_experts, num_experts_per_tok"),
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

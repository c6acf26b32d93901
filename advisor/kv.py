"""What the workspace bytes trade: KV-cache tokens per rank (the memory both live in).

Lowering the cap frees workspace bytes that the KV pool can take (SGLang sizes the pool from the free
memory at start-up), raising it costs them. ``kv_bytes_per_token`` is the model's (``sizing/model_presets.py``:
MLA or GQA, per dtype); None when the model is unknown, and then only bytes are stated.
"""

from __future__ import annotations

from capwatch.sizing.byte_units import format_gib


def kv_tokens(workspace_bytes_per_rank: int, kv_bytes_per_token: int | None) -> int | None:
    return None if not kv_bytes_per_token else int(workspace_bytes_per_rank / kv_bytes_per_token)


def kv_trade(action: str, current_bytes: int, recommended_bytes: int, kv_bytes_per_token: int | None) -> str | None:
    """The reason line: what the advice frees or costs per rank in KV-cache tokens."""
    if not kv_bytes_per_token:
        return None
    if action in ("raise", "lower") and recommended_bytes != current_bytes:
        delta = recommended_bytes - current_bytes
        verb = "frees" if delta < 0 else "costs"
        return (f"{'lowering' if delta < 0 else 'raising'} {verb} {format_gib(abs(delta))} per rank ≈ "
                f"{abs(delta) // kv_bytes_per_token:,} KV-cache tokens per rank "
                f"({kv_bytes_per_token:,} bytes per token)")
    return (f"the workspace of {format_gib(current_bytes)} per rank holds the room of "
            f"{current_bytes // kv_bytes_per_token:,} KV-cache tokens per rank ({kv_bytes_per_token:,} bytes per token)")


def kv_bytes_per_token_of(hidden_size: int | None, top_k: int | None, num_experts: int | None,
                          kv_cache_dtype: str | None = None) -> int | None:
    """KV bytes per token for a rank's reported MoE geometry, when it matches one preset (ranks report
    geometry, not a model name); None otherwise."""
    from capwatch.sizing.model_presets import preset_for_geometry

    if not (hidden_size and top_k and num_experts):
        return None
    preset = preset_for_geometry(hidden_size, top_k, num_experts)
    return None if preset is None or preset.kv_cache is None else preset.kv_cache.bytes_per_token(kv_cache_dtype)

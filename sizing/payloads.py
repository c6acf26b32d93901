"""Bytes per token of each A2A payload: the hidden states in each format (with block scales), the
routing (int32 top-k ids, fp32 weights), and the combine's bf16 output."""

from __future__ import annotations

from capwatch.sizing.checks import MAX_HIDDEN_SIZE, SizingError, check_positive

# The formats every capwatch component knows (the telemetry report validates against this tuple).
PAYLOAD_FORMATS: tuple[str, ...] = ("bf16", "fp16", "fp8", "nvfp4", "mxfp8")
# Formats flashinfer.moe_ep's MoEEpCommParams also sizes (QuantFormat MXFP4 and DeepSeekFp8).
EXTRA_PAYLOAD_FORMATS: tuple[str, ...] = ("mxfp4", "deepseek-fp8")
SIZING_PAYLOAD_FORMATS: tuple[str, ...] = PAYLOAD_FORMATS + EXTRA_PAYLOAD_FORMATS
# capwatch name -> flashinfer.fused_moe.QuantFormat member name (MoEEpCommParams.dispatch_format).
MOE_EP_QUANT_FORMATS: dict[str, str] = {
    "bf16": "BF16", "fp16": "FP16", "fp8": "FP8PerTensor", "deepseek-fp8": "DeepSeekFp8",
    "mxfp8": "MXFP8", "nvfp4": "NVFP4", "mxfp4": "MXFP4",
}
# Elements per block scale; the hidden size must be a whole number of blocks.
_SCALE_BLOCK = {"nvfp4": 16, "mxfp8": 32, "mxfp4": 32}
TOPK_ID_BYTES = 4  # int32 expert ids
TOPK_WEIGHT_BYTES = 4  # fp32 router weights


def check_payload_format(payload_format: str) -> str:
    if payload_format not in SIZING_PAYLOAD_FORMATS:
        raise SizingError(
            f"unknown payload format {payload_format!r}; choose one of {', '.join(SIZING_PAYLOAD_FORMATS)}"
        )
    return payload_format


def hidden_bytes_per_token(hidden_size: int, payload_format: str) -> int:
    """Bytes of the hidden-state payload (with its block scales) for one token.

    Same table as flashinfer 0.7.x ``moe_ep`` ``_DISPATCH_BYTES_PER_TOKEN``; block-scaled formats
    need whole blocks (the quantisers require them), so its ceilings are exact divisions here.
    """
    check_positive("hidden_size", hidden_size)
    if hidden_size > MAX_HIDDEN_SIZE:
        raise SizingError(f"hidden_size {hidden_size} exceeds {MAX_HIDDEN_SIZE}, more than any real model")
    check_payload_format(payload_format)
    block = _SCALE_BLOCK.get(payload_format)
    if block and hidden_size % block:
        raise SizingError(
            f"{payload_format} carries one scale per {block} values: hidden_size {hidden_size} "
            f"must be a multiple of {block}"
        )
    if payload_format in ("bf16", "fp16"):
        return 2 * hidden_size
    if payload_format == "fp8":  # per-tensor scale: a scalar that does not travel with the tokens
        return hidden_size
    if payload_format == "deepseek-fp8":  # e4m3 values + one fp32 scale per 128-element block
        return hidden_size + 4 * -(-hidden_size // 128)
    if payload_format == "nvfp4":  # two e2m1 values per byte + one e4m3 scale per 16 elements
        return hidden_size // 2 + hidden_size // 16
    if payload_format == "mxfp8":  # one byte per value + one ue8m0 scale per 32 elements
        return hidden_size + hidden_size // 32
    return hidden_size // 2 + hidden_size // 32  # mxfp4: e2m1 pairs + one ue8m0 scale per 32


def routing_bytes_per_token(top_k: int) -> int:
    """int32 top-k ids + fp32 top-k weights, the two routing payloads."""
    check_positive("top_k", top_k)
    return (TOPK_ID_BYTES + TOPK_WEIGHT_BYTES) * top_k


def dispatch_bytes_per_token(hidden_size: int, top_k: int, payload_format: str = "bf16") -> int:
    """Hidden payload + int32 top-k ids + fp32 top-k weights, as SGLang and TRT-LLM send them."""
    check_positive("top_k", top_k)
    return hidden_bytes_per_token(hidden_size, payload_format) + routing_bytes_per_token(top_k)


def combine_bytes_per_token(hidden_size: int) -> int:
    """Combine sends the expert output back in bf16."""
    check_positive("hidden_size", hidden_size)
    return 2 * hidden_size

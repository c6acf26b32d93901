"""A start-up ``server_args={...}`` line -> what the advisor needs, by SGLang 0.5.23's own rules.

The line is ``logger.info(f"server_args={_server_args_for_logging(server_args)}")``
(``entrypoints/engine.py``): the repr of ``ServerArgs.resolved_dict()``, resolved values, nested
records (``cuda_graph_config``) as dicts. The rules below are SGLang's, read from the wheel:

- tokens per request per decode/verify step: ``max_speculative_num_draft_tokens() or 1`` with a
  speculative algorithm, else 1 (``arg_groups/moe_hook.py`` ``_decode_graph_dispatch_tokens_per_rank``);
- decode graph batch: ``cuda_graph_config.decode.max_bs`` (0 when that backend is ``disabled`` or on a
  prefill server), at most ``max_running_requests // attn_dp_size``;
- prefill buffer: ``chunked_prefill_size`` if > 0, grown to ``max(max_prefill_tokens, 1.25 x chunk)`` by
  PP dynamic chunking (``arg_groups/overrides.py`` ``max_prefill_buffer_tokens``);
- the default cap (the env var unset): ``max(prefill buffer, 4096)``
  (``overrides.py`` ``flashinfer_a2a_max_dispatch_tokens_per_rank``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

from capwatch.telemetry.report import SGLangLimits

SGLANG_DEFAULT_MIN_CAP = 4096  # overrides.py flashinfer_a2a_max_dispatch_tokens_per_rank
DEFAULT_DECODE_LOG_INTERVAL = 40  # fields/observability.py decode_log_interval

# Values whose repr is not a literal (an enum or object's <...>, a float's inf or nan): read as None, so the
# rest of the dict stays readable. Applied only when the plain literal_eval fails.
_NON_LITERAL = re.compile(r"<[^<>]*>|(?<![\w'\".])-?(?:inf|nan)(?![\w'\"])")


class UnreadableArgs(ValueError):
    pass


@dataclass(frozen=True)
class ServerConfig:
    """The parts of one SGLang start that size the cap (equal configs = the same configuration)."""

    model_path: str | None
    tp_size: int
    ep_size: int
    attn_dp_size: int
    moe_a2a_backend: str | None
    limits: SGLangLimits
    default_cap: int
    speculative_algorithm: str | None
    decode_log_interval: int
    kv_cache_dtype: str | None

    @property
    def tokens_per_request(self) -> int:
        return self.limits.tokens_per_request

    @property
    def a2a_group_size(self) -> int:
        """FlashinferDispatcher's ep_size is its group's size: the TP group (0.5.23 requires
        attn_dp_size == tp_size for this backend), so tp_size, or ep_size if larger."""
        return max(self.tp_size, self.ep_size)


def parse_args_dict(text: str) -> dict[str, Any]:
    """The dict after ``server_args=`` (the rest of the line)."""
    start = text.find("{")
    if start < 0:
        raise UnreadableArgs("no '{' after server_args=")
    body = text[start:].rstrip()
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            value = ast.literal_eval(_NON_LITERAL.sub("None", body))
        except (ValueError, SyntaxError, MemoryError, RecursionError) as error:
            raise UnreadableArgs(f"not a Python dict literal ({type(error).__name__}: {error})") from None
    if not isinstance(value, dict):
        raise UnreadableArgs(f"a {type(value).__name__}, not a dict")
    return value


def _int(args: dict, key: str, default: int | None = None) -> int | None:
    value = args.get(key, default)
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, (int, float)) and math.isfinite(value):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def _phase(args: dict, phase: str) -> dict:
    config = args.get("cuda_graph_config")
    if isinstance(config, dict) and isinstance(config.get(phase), dict):
        return config[phase]
    return {}


def max_prefill_buffer_tokens(args: dict) -> int:
    chunked = _int(args, "chunked_prefill_size", 0) or 0
    tokens = chunked if chunked > 0 else 0
    if args.get("enable_dynamic_chunking") and (_int(args, "pp_size", 1) or 1) > 1 and tokens:
        tokens = max(tokens, _int(args, "max_prefill_tokens", 0) or 0, math.ceil(chunked * 1.25))
    return tokens


def server_config(args: dict) -> ServerConfig:
    if "tp_size" not in args and "ep_size" not in args:
        raise UnreadableArgs("it has neither tp_size nor ep_size: not SGLang's resolved server args")
    mode = args.get("disaggregation_mode") or "null"
    if mode not in ("null", "prefill", "decode"):
        mode = "null"
    attn_dp_size = max(1, _int(args, "attn_dp_size", 0) or 0)
    if attn_dp_size == 1 and args.get("enable_dp_attention"):  # a dict from before attn_dp_size existed
        attn_dp_size = max(1, _int(args, "dp_size", 1) or 1)
    decode = _phase(args, "decode")
    prefill = _phase(args, "prefill")
    if "backend" in decode or "max_bs" in decode:
        decode_backend, decode_bs = decode.get("backend", "full"), _int(decode, "max_bs", 0) or 0
    else:  # no nested config: the flat flags
        disabled = bool(args.get("disable_cuda_graph") or args.get("disable_decode_cuda_graph"))
        decode_backend = "disabled" if disabled else "full"
        decode_bs = _int(args, "cuda_graph_max_bs_decode", 0) or _int(args, "cuda_graph_max_bs", 0) or 0
    if mode == "prefill" or decode_backend == "disabled":
        decode_bs = 0
    max_running = _int(args, "max_running_requests")
    if max_running is not None and decode_bs:
        decode_bs = min(decode_bs, max(1, max_running // attn_dp_size))
    if "backend" in prefill or "max_bs" in prefill:
        prefill_bs = 0 if prefill.get("backend") == "disabled" else _int(prefill, "max_bs", 0) or 0
    else:
        disabled = bool(args.get("disable_cuda_graph") or args.get("disable_prefill_cuda_graph"))
        prefill_bs = 0 if disabled else _int(args, "cuda_graph_max_bs_prefill", 0) or 0
    algorithm = args.get("speculative_algorithm") or None
    draft_tokens = _int(args, "speculative_num_draft_tokens")
    tokens_per_request = (draft_tokens or 1) if algorithm else 1
    buffer = max_prefill_buffer_tokens(args)
    limits = SGLangLimits(
        disaggregation_mode=mode, max_prefill_buffer_tokens=buffer,
        prefill_cuda_graph_max_batch_size=prefill_bs, decode_cuda_graph_max_batch_size=decode_bs,
        tokens_per_request=max(1, min(tokens_per_request, 1024)), cap_source="default")
    model_path = args.get("model_path")
    return ServerConfig(
        model_path=model_path if isinstance(model_path, str) else None,
        tp_size=_int(args, "tp_size", 1) or 1, ep_size=_int(args, "ep_size", 1) or 1, attn_dp_size=attn_dp_size,
        moe_a2a_backend=args.get("moe_a2a_backend") if isinstance(args.get("moe_a2a_backend"), str) else None,
        limits=limits, default_cap=max(buffer, SGLANG_DEFAULT_MIN_CAP),
        speculative_algorithm=algorithm if isinstance(algorithm, str) else None,
        decode_log_interval=_int(args, "decode_log_interval", DEFAULT_DECODE_LOG_INTERVAL) or DEFAULT_DECODE_LOG_INTERVAL,
        kv_cache_dtype=args.get("kv_cache_dtype") if isinstance(args.get("kv_cache_dtype"), str) else None)

"""A start-up ``server_args=`` line -> what the advisor needs, by SGLang's own rules.

SGLang logs its resolved arguments once per start: the ``ServerArgs(...)`` repr up to 0.5.18, the repr of
``ServerArgs.resolved_dict()`` from 0.5.19 (``FROM_0_5_22_KEYS`` tell 0.5.22's on, which check the cap at start).
The form says which floor rule the server ran by (``floor_rule``); the floor's terms come from
``sglang_engine/floor_terms.py``, as the plugin's do. Read by parsing (``ast.parse`` and a walk over literals and
keyword calls), never by evaluating, within ``MAX_ARGS_CHARS`` and ``MAX_ARGS_ITEMS``, every number that sizes the
cap checked to be plausible: anything else is an ``UnreadableArgs`` with one line saying why. The rules read from
each release's wheel, per setting: docs/sglang-logs.md ("The args line") and docs/advisor.md ("Advice from SGLang
logs").
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

from capwatch.backends import SPECS
from capwatch.sizing.caps import MAX_CAP_TOKENS
from capwatch.sglang_engine.caps import CAPS, DEFAULT_MIN_CAP
from capwatch.sglang_engine.floor_terms import decode_graph_term, floor_limits, prefill_graph_term
from capwatch.sglang_engine.limits import MAX_TOKENS_PER_REQUEST, SGLangLimits

DEFAULT_DECODE_LOG_INTERVAL = 40  # fields/observability.py decode_log_interval
ARGS_MARK = "server_args="
# SGLang's args line is tens of KiB (0.5.23: about 20 KiB for 542 fields); beyond this it is not one.
MAX_ARGS_CHARS = 1 << 20
# Items (commas) an args line may hold: SGLang's have a few hundred. Parsing builds a node per item, about 1 KB
# each: a line of 1 Mi characters of "1," cost 529 MB (issue 36, F7b) before this bound.
MAX_ARGS_ITEMS = 20_000
MAX_PARALLEL_SIZE = 1 << 16  # tp/ep/dp sizes: far beyond any cluster
_MAX_DEPTH = 32  # nesting of records in the args (SGLang's is 3)
# Keys of the resolved dict from 0.5.22 on that 0.5.19 - 0.5.21's lack (their own start-up lines,
# tests/sglang/test_logs.py): either one says the server checked its cap at start-up.
FROM_0_5_22_KEYS = ("attn_dp_size", "enable_watermark")

# Values whose repr is not Python syntax (an enum's or object's <...>): read as None, so the rest of the
# args stays readable. Applied only when the plain parse fails.
_NOT_SYNTAX = re.compile(r"<[^<>\n]{0,512}>")
_NAMES = {"inf": math.inf, "nan": math.nan, "True": True, "False": False, "None": None}


class UnreadableArgs(ValueError):
    pass


@dataclass(frozen=True)
class DefaultCapRule:
    """How SGLang sizes the cap when the backend's variable is unset: FlashInfer's ``max(prefill, 4096)``, the
    prefill being the prefill buffer from 0.5.22 (``overrides.py`` ``flashinfer_a2a_max_dispatch_tokens_per_rank``)
    and the chunked-prefill size before (``FlashinferDispatcher.__init__``, 0 when chunking is off); a backend
    with a fixed default (``BackendCapRules.default_cap``: DeepEP's 128) that number."""

    prefill_tokens: int
    prefill_name: str  # "prefill buffer" (0.5.22+) or "chunked prefill" (before)

    def cap(self, backend: str | None) -> int:
        rules = SPECS[backend].rules if backend in SPECS else None
        if rules is not None and rules.default_cap is not None:
            return rules.default_cap
        return max(self.prefill_tokens, DEFAULT_MIN_CAP)

    def words(self, backend: str | None) -> str:
        rules = SPECS[backend].rules if backend in SPECS else None
        if rules is not None and rules.default_cap is not None:
            return f"SGLang's default {rules.default_cap} for {rules.name}"
        return f"SGLang's default max({self.prefill_name} {self.prefill_tokens}, {DEFAULT_MIN_CAP})"


@dataclass(frozen=True)
class ServerConfig:
    """The parts of one SGLang start that size the cap (equal configs = the same configuration)."""

    model_path: str | None
    tp_size: int
    ep_size: int
    attn_dp_size: int
    moe_a2a_backend: str | None  # None: the args do not say (a release before the option)
    tokens_per_request: int
    limits: SGLangLimits | None  # SGLang's start-up floor inputs; None: unknown (no start-up line)
    default_cap: int | None  # the cap without the env var; None: unknown
    default_rule: DefaultCapRule | None = None  # how SGLang computed it (None: given by flags)
    speculative_algorithm: str | None = None
    decode_log_interval: int | None = DEFAULT_DECODE_LOG_INTERVAL  # None: unknown
    kv_cache_dtype: str | None = None
    # What sizes the backend beyond the model, as its spec reads it (``BackendSpec.settings_params``).
    a2a_params: tuple[tuple[str, object], ...] = ()
    mem_fraction_static: float | None = None  # as resolved (SGLang's automatic value, or the flag); None: unknown

    @property
    def a2a_group_size(self) -> int:
        """FlashinferDispatcher's ep_size is its group's size: the TP group (0.5.23 requires
        attn_dp_size == tp_size for this backend), so tp_size, or ep_size if larger."""
        return max(self.tp_size, self.ep_size)


def shown(text: object, limit: int = 40) -> str:
    """A value as a message quotes it: a 5,000-digit mistake stays a one-line message."""
    text = str(text)
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


def parse_args(text: str) -> dict[str, Any]:
    """The value after ``server_args=`` (the rest of the line): a dict, or a dataclass repr read as one."""
    body = text.strip()
    if len(body) > MAX_ARGS_CHARS:
        raise UnreadableArgs(f"{len(body):,} characters, more than any SGLang args line ({MAX_ARGS_CHARS:,} at most)")
    items = body.count(",")
    if items > MAX_ARGS_ITEMS:
        raise UnreadableArgs(f"{items:,} items, more than any SGLang args line ({MAX_ARGS_ITEMS:,} at most)")
    if not body.startswith("{") and not re.match(r"[A-Za-z_]\w*\(", body):
        raise UnreadableArgs(f"{shown(body)} is neither a dict nor a ServerArgs(...) repr")
    try:
        tree = _parse(body)
    except UnreadableArgs:
        tree = _parse(_NOT_SYNTAX.sub("None", body))
    if not isinstance(tree, (ast.Dict, ast.Call)):
        raise UnreadableArgs(f"not one dict or ServerArgs(...) repr but a {type(tree).__name__} expression")
    return _value(tree, 0)


def _parse(body: str) -> ast.expr:
    try:
        return ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UnreadableArgs(f"not Python syntax ({shown(reason, 80)})") from None


def _value(node: ast.AST, depth: int) -> Any:
    """A literal, or a record: ``Name(key=value, ...)`` and ``{...}`` both read as dicts. Nothing runs."""
    if depth > _MAX_DEPTH:
        raise UnreadableArgs(f"nested deeper than {_MAX_DEPTH} levels")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {key.value: _value(value, depth + 1) for key, value in zip(node.keys, node.values)
                if isinstance(key, ast.Constant) and isinstance(key.value, (str, int))}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Call):
        return {keyword.arg: _value(keyword.value, depth + 1) for keyword in node.keywords if keyword.arg}
    if isinstance(node, ast.Name):
        return _NAMES.get(node.id)
    if isinstance(node, ast.Attribute):  # an enum member spelled Backend.FULL
        return node.attr
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand, depth + 1)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    return None  # anything else (an expression) is not a value SGLang logs


def _int(args: dict, key: str, default: int | None = None, *, limit: int = MAX_CAP_TOKENS) -> int | None:
    """An integer setting, ``default`` when absent or null; UnreadableArgs when it is no plausible number."""
    value = args.get(key)
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, str):
        text = value.strip()
        if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit()) or len(text) > 12:
            return default  # SGLang's own "auto"-like strings: not set
        value = int(text)
    if isinstance(value, float):
        if not math.isfinite(value):
            return default
        value = int(value)
    if not isinstance(value, int):
        return default
    if abs(value) > limit:
        raise UnreadableArgs(f"{key}={shown(value)} is not a plausible value (at most {limit:,})")
    return value


def _size(args: dict, key: str, default: int, least: int) -> int:
    """A parallel size or an expert count: ``_int``'s value, refused below ``least`` (SGLang would not start with
    tp_size -5; taking it as 1 would advise a group that never ran)."""
    value = _int(args, key, default, limit=MAX_PARALLEL_SIZE)
    if value is not None and value < least:
        raise UnreadableArgs(f"{key}={shown(value)} is not a plausible value (at least {least})")
    return default if value is None else value


def _backend_name(args: dict) -> str | None:
    """``moe_a2a_backend``: None when the args do not name it (a release before the option); a value that is no
    backend name at all (a number, a long string) is refused, never read as "not named"."""
    if "moe_a2a_backend" not in args or args["moe_a2a_backend"] is None:
        return None
    value = args["moe_a2a_backend"]
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
        raise UnreadableArgs(f"moe_a2a_backend={shown(value)} is not a backend name (e.g. "
                             f"{', '.join(map(repr, SPECS))}, 'none')")
    return value


def _phase(args: dict, phase: str) -> dict:
    config = args.get("cuda_graph_config")
    if isinstance(config, dict) and isinstance(config.get(phase), dict):
        return config[phase]
    return {}


def _fraction(args: dict, key: str) -> float | None:
    """A share in (0, 1]; None when absent or anything else (a fraction capwatch would not act on)."""
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 < value <= 1.0 else None


def _text(args: dict, key: str) -> str | None:
    value = args.get(key)
    return value if isinstance(value, str) and len(value) <= 4096 else None


@dataclass(frozen=True)
class _Args:
    """The args as a backend's spec reads them (``capwatch.backends.spec.SettingsReader``)."""

    args: dict

    def text(self, key: str) -> str | None:
        return _text(self.args, key)

    def size(self, key: str, default: int, least: int) -> int:
        return _size(self.args, key, default, least)

    def flag(self, key: str) -> bool:
        return bool(self.args.get(key))


def _backend_params(args: dict) -> dict[str, tuple[tuple[str, object], ...]]:
    """What sizes each known backend beyond the model, read by its spec: every backend's settings are read, so one
    that is no plausible value is refused whichever backend the server runs."""
    reader = _Args(args)
    return {name: spec.settings_params(reader) for name, spec in SPECS.items()}


def max_prefill_buffer_tokens(args: dict) -> int:
    chunked = _int(args, "chunked_prefill_size", 0) or 0
    tokens = chunked if chunked > 0 else 0
    if args.get("enable_dynamic_chunking") and (_int(args, "pp_size", 1, limit=MAX_PARALLEL_SIZE) or 1) > 1 and tokens:
        tokens = max(tokens, _int(args, "max_prefill_tokens", 0) or 0, math.ceil(chunked * 1.25))
    if tokens > MAX_CAP_TOKENS:
        raise UnreadableArgs(f"a prefill buffer of {tokens:,} tokens is beyond any cap (at most {MAX_CAP_TOKENS:,})")
    return tokens


def with_start_check(limits: SGLangLimits, backend: str, args: dict, mode: str) -> SGLangLimits:
    """``limits`` with SGLang's own start-up check of the backend's cap where its rule is the prefill chunk or the
    decode CUDA-graph batch as set (``cuda_graph_max_bs_decode``, not the bucket it resolves to), the larger
    (``CAPS``: pplx's, in every verified release): checked on a server with chunked prefill that is not a decode
    server, and nowhere else (capwatch's floor there). As the plugin reads it with SGLang's own function
    (``tests/sglang/test_logs.py`` compares them on each release's own start-up line)."""
    cap = CAPS.get(backend)
    if cap is None or not cap.start_check_prefill_or_decode_batch:
        return limits
    chunked_prefill = _int(args, "chunked_prefill_size", 0) or 0
    if chunked_prefill <= 0 or mode == "decode":
        return limits.model_copy(update={"floor_rule": "capwatch"})
    decode_graph_batch = _int(args, "cuda_graph_max_bs_decode", 0) or 0
    return limits.model_copy(update={"max_prefill_buffer_tokens": max(chunked_prefill, decode_graph_batch),
                                     "floor_rule": "sglang"})


def checks_cap_at_startup(args: dict, resolved_dict: bool) -> bool:
    """Whether the server ran 0.5.22's rules or later (see the module's docstring); a repr is older."""
    return resolved_dict and any(key in args for key in FROM_0_5_22_KEYS)


def server_config(args: dict, *, resolved_dict: bool = True) -> ServerConfig:
    """``resolved_dict``: the line was a dict (0.5.19+), not a ``ServerArgs(...)`` repr."""
    if "tp_size" not in args and "ep_size" not in args:
        raise UnreadableArgs("it has neither tp_size nor ep_size: not SGLang's server args")
    mode = args.get("disaggregation_mode") or "null"
    if mode not in ("null", "prefill", "decode"):
        mode = "null"
    sizes = {key: max(1, _size(args, key, 1, least=1)) for key in ("tp_size", "ep_size", "dp_size")}
    attn_dp_size = max(1, _size(args, "attn_dp_size", 0, least=0))
    if attn_dp_size == 1 and args.get("enable_dp_attention"):  # before attn_dp_size was logged (< 0.5.22)
        attn_dp_size = sizes["dp_size"]
    decode = _phase(args, "decode")
    prefill = _phase(args, "prefill")
    if "backend" in decode or "max_bs" in decode:
        decode_off, decode_bs = decode.get("backend", "full") == "disabled", _int(decode, "max_bs", 0)
    else:  # no nested config: the flat flags (0.5.13: cuda_graph_max_bs only)
        decode_off = bool(args.get("disable_cuda_graph") or args.get("disable_decode_cuda_graph"))
        decode_bs = _int(args, "cuda_graph_max_bs_decode", 0) or _int(args, "cuda_graph_max_bs", 0)
    if "backend" in prefill or "max_bs" in prefill:
        prefill_off, prefill_bs = prefill.get("backend") == "disabled", _int(prefill, "max_bs", 0)
    else:
        prefill_off = bool(args.get("disable_cuda_graph") or args.get("disable_prefill_cuda_graph"))
        prefill_bs = _int(args, "cuda_graph_max_bs_prefill", 0)
    max_running = _int(args, "max_running_requests", limit=1 << 31)
    algorithm = _text(args, "speculative_algorithm")
    speculative = bool(algorithm) and algorithm.upper() != "NONE"
    draft_tokens = _int(args, "speculative_num_draft_tokens", limit=MAX_TOKENS_PER_REQUEST)
    decode_graph = decode_graph_term(mode, decode_off, decode_bs, max_running if max_running and max_running > 0
                                     else None, attn_dp_size, speculative, draft_tokens)
    tokens_per_request = decode_graph[1]
    buffer = max_prefill_buffer_tokens(args)
    checked = checks_cap_at_startup(args, resolved_dict)
    limits = floor_limits(
        sglang_version=None, disaggregation_mode=mode, max_prefill_buffer_tokens=buffer,
        prefill_graph=prefill_graph_term(prefill_off, prefill_bs), decode_graph=decode_graph, cap_source="default",
        floor_rule="sglang" if checked else "capwatch" if resolved_dict else "capwatch_prefill")
    interval = _int(args, "decode_log_interval", DEFAULT_DECODE_LOG_INTERVAL)
    backend = _backend_name(args)
    if resolved_dict:
        limits = with_start_check(limits, backend, args, mode)
    rule = DefaultCapRule(buffer, "prefill buffer") if checked else DefaultCapRule(
        max(0, _int(args, "chunked_prefill_size", 0) or 0), "chunked prefill")
    return ServerConfig(
        model_path=_text(args, "model_path"), tp_size=sizes["tp_size"], ep_size=sizes["ep_size"],
        attn_dp_size=attn_dp_size, moe_a2a_backend=backend,
        tokens_per_request=tokens_per_request, limits=limits, default_cap=rule.cap(backend), default_rule=rule,
        speculative_algorithm=algorithm,
        decode_log_interval=interval if interval and interval > 0 else DEFAULT_DECODE_LOG_INTERVAL,
        kv_cache_dtype=_text(args, "kv_cache_dtype"),
        a2a_params=_backend_params(args).get(backend, ()),
        mem_fraction_static=_fraction(args, "mem_fraction_static"))


def read_server_args(text: str) -> ServerConfig:
    """The configuration of the text after ``server_args=``."""
    return server_config(parse_args(text), resolved_dict=text.lstrip().startswith("{"))

"""SGLang's side of FlashInfer's MoE A2A (``--moe-a2a-backend flashinfer``): how SGLang's ``FlashinferDispatcher``
sizes the workspace it asks ``MoeAlltoAll`` for, as ``capwatch plan``'s modes.

``flashinfer``     FlashInfer's own formula for the given payload format and version
                   (``sizing/flashinfer_plan.py`` ``FLASHINFER_FORMULA``), as a caller other than SGLang sizes it.
``sglang``         what SGLang's ``FlashinferDispatcher`` allocates (sglang
                   ``python/sglang/srt/layers/moe/token_dispatcher/flashinfer.py``): dispatch bytes
                   are never below the bf16 payload (``max(quantized, bf16)``, and bf16 for any
                   format it cannot dispatch quantized), and a speculative draft model's dispatcher
                   adds 128 B (``_workspace_size_for_namespace``) so its workspace gets its own
                   FlashInfer cache entry.
``sglang-legacy``  SGLang before PR #25907: ``max_num_tokens = cap * ep_size`` although FlashInfer
                   already multiplies by ep_size (an ep_size-fold over-allocation of the payload
                   and routing regions); nvfp4 dispatch sized unfloored, everything else bf16.
"""

from __future__ import annotations

import functools

from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_plan import (
    FLASHINFER_FORMULA,
    Allocation,
    WorkspacePlan,
    largest_plan_within as largest_plan_by_allocation_within,
    plan_workspace as plan_workspace_by_allocation,
)
from capwatch.sizing.flashinfer_releases import LAYOUT_MOE_A2A, FlashInferVersion
from capwatch.sizing.payloads import dispatch_bytes_per_token
from capwatch.sizing.model_presets import ModelGeometry

# SGLang's facts in FlashInfer's cap rules (bound by sglang_engine/caps.py): before PR #25907 its dispatcher sized the
# workspace for cap x ep_size tokens per rank, which the service's findings recognise in a reported size.
CAP_RULES = dict(sized_for_group_bug=True)

MODES: tuple[str, ...] = ("flashinfer", "sglang", "sglang-legacy")
DRAFT_NAMESPACE_BYTES = 128  # sglang _WORKSPACE_NAMESPACE_ALIGNMENT

# capwatch plan's words for the modes (its --help and its --mode and --draft options).
MODES_HELP = """\
Modes: sglang (default) = what SGLang allocates (bf16 floor on dispatch bytes, so nvfp4 and fp8 cost the
bf16 figure; +128 B with --draft); flashinfer = FlashInfer's formula for the payload format, as a caller
other than SGLang allocates it; sglang-legacy = SGLang before PR #25907 (cap x ep_size passed as
max_num_tokens, an ep_size-fold over-allocation). Every table names its mode in its title."""
MODE_OPTION_HELP = ("sglang (default: what SGLang allocates, bf16 dispatch bytes at least), flashinfer (FlashInfer's "
                    "own formula for the payload) or sglang-legacy")
DRAFT_OPTION_HELP = f"size SGLang's speculative draft dispatcher (+{DRAFT_NAMESPACE_BYTES} B)"


def sglang_dispatch_bytes_per_token(hidden_size: int, top_k: int, payload_format: str) -> int:
    """SGLang's ``total_dispatch_payload_size_per_token``: never below the bf16 payload."""
    bf16 = dispatch_bytes_per_token(hidden_size, top_k, "bf16")
    if payload_format in ("nvfp4", "mxfp8"):  # its two quantized dispatch types
        return max(dispatch_bytes_per_token(hidden_size, top_k, payload_format), bf16)
    return bf16


def sglang_legacy_dispatch_bytes_per_token(hidden_size: int, top_k: int, payload_format: str) -> int:
    """Before #25907 nvfp4 dispatch was sized as sent; there was no mxfp8 path."""
    return dispatch_bytes_per_token(hidden_size, top_k, "nvfp4" if payload_format == "nvfp4" else "bf16")


def _refusal(mode: str, draft: bool, version: FlashInferVersion, eplb_stats_num_experts: int) -> str | None:
    """What SGLang's dispatcher cannot be asked (``mode`` one of SGLang's) or what only it can (a draft)."""
    if mode != "flashinfer" and version.layout != LAYOUT_MOE_A2A:
        return (f"SGLang's dispatcher calls flashinfer.comm.MoeAlltoAll, which flashinfer {version.version} "
                "removed; pick a version <= 0.7.2.post1 for --mode sglang/sglang-legacy")
    if mode != "flashinfer" and eplb_stats_num_experts:
        return "SGLang's dispatcher reserves no EPLB stats region: drop --eplb-stats-experts or use --mode flashinfer"
    if draft and mode != "sglang":
        return (f"draft sizing (+{DRAFT_NAMESPACE_BYTES} B namespace) exists only in SGLang's dispatcher: use "
                "--mode sglang")
    return None


@functools.lru_cache(maxsize=None)
def allocation(mode: str = "flashinfer", draft: bool = False) -> Allocation:
    """The ``Allocation`` of ``capwatch plan --mode MODE`` (with ``--draft``); SizingError for an unknown mode."""
    if mode not in MODES:
        raise SizingError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    refusal = functools.partial(_refusal, mode, draft)
    if mode == "sglang":
        return Allocation(mode, sglang_dispatch_bytes_per_token, draft=draft,
                          namespace_bytes=DRAFT_NAMESPACE_BYTES if draft else 0, refusal=refusal)
    if mode == "sglang-legacy":
        return Allocation(mode, sglang_legacy_dispatch_bytes_per_token, tokens_for_group=True, draft=draft,
                          refusal=refusal)
    return FLASHINFER_FORMULA if not draft else Allocation(mode, draft=draft, refusal=refusal)


def default_mode(flashinfer_version: str | None, eplb_stats_num_experts) -> str:
    """``sglang`` (what SGLang allocates: the cap is SGLang's variable), unless the question is one SGLang never
    asks: a flashinfer release without the MoeAlltoAll SGLang calls (0.7.4), or an EPLB stats region."""
    try:
        layout = FlashInferVersion.parse(flashinfer_version).layout
    except SizingError:  # an unknown release: plan_workspace says so in its own words
        return "sglang"
    return "sglang" if layout == LAYOUT_MOE_A2A and not eplb_stats_num_experts else "flashinfer"


def plan_workspace(geometry: ModelGeometry, ep_size: int, cap: int, payload_format: str = "bf16",
                   eplb_stats_num_experts: int = 0, flashinfer_version: str | None = None, mode: str = "flashinfer",
                   draft: bool = False, **layout_options) -> WorkspacePlan:
    """The workspace one rank allocates for ``cap`` tokens per rank, sized as ``mode`` says (``MODES``); the
    rest as ``sizing/flashinfer_plan.py`` ``plan_workspace``. Raises ``SizingError``."""
    try:
        chosen = allocation(mode, draft)
    except SizingError:
        FlashInferVersion.parse(flashinfer_version)  # an unknown release is said first, as before the modes
        raise
    return plan_workspace_by_allocation(geometry, ep_size, cap, payload_format, eplb_stats_num_experts,
                                        flashinfer_version, chosen, **layout_options)


def largest_plan_within(budget_bytes: int, geometry: ModelGeometry, ep_size: int, payload_format: str = "bf16",
                        eplb_stats_num_experts: int = 0, flashinfer_version: str | None = None,
                        mode: str = "flashinfer", draft: bool = False, **options) -> WorkspacePlan:
    """The plan of the largest aligned cap whose workspace, sized as ``mode`` says, fits the budget
    (``sizing/flashinfer_plan.py`` ``largest_plan_within``)."""
    return largest_plan_by_allocation_within(budget_bytes, geometry, ep_size, payload_format, eplb_stats_num_experts,
                                             flashinfer_version, allocation(mode, draft), **options)

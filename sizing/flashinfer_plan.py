"""What a per-rank cap costs: one model geometry + EP size + cap -> the workspace FlashInfer allocates.

Who sizes what FlashInfer is asked for is the plan's ``Allocation``: FlashInfer's own formula for the payload
format and version (``FLASHINFER_FORMULA``: the ``moe_a2a`` layout up to 0.7.2.post1,
``NVLinkOneSidedAlltoAll``'s in 0.7.4), or a caller's rule for what it passes to ``MoeAlltoAll`` (an engine's
dispatcher: the dispatch bytes per token it sizes for, the tokens per rank it passes, bytes it adds to the
workspace, what it refuses). The engine's allocations live in its home (SGLang's: ``sglang_engine/flashinfer.py``).

Pure arithmetic, no torch: the advisor prices many caps with these per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from capwatch.sizing.flashinfer_releases import FLASHINFER
from capwatch.sizing.caps import CAP_ALIGNMENT, largest_aligned_cap
from capwatch.sizing.checks import INT32_MAX, SizingError, check_positive
from capwatch.sizing.flashinfer_moe_a2a import workspace_layout
from capwatch.sizing.flashinfer_one_sided import LAMPORT_MAX_TOKENS_PER_RANK, nvlink_one_sided_layout
from capwatch.sizing.flashinfer_releases import (
    LAYOUT_MOE_A2A,
    FlashInferVersion,
    check_ep_size,
    check_eplb_stats,
    check_max_num_tokens,
    check_routing,
)
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.sizing.payloads import (
    check_payload_format,
    combine_bytes_per_token,
    dispatch_bytes_per_token,
    hidden_bytes_per_token,
    routing_bytes_per_token,
)



@dataclass(frozen=True)
class Allocation:
    """Who sizes the workspace FlashInfer is asked for, named by its ``mode`` in every plan: FlashInfer's own
    formula (``FLASHINFER_FORMULA``), or a caller's rule for what it passes to ``MoeAlltoAll``."""

    mode: str
    # (hidden_size, top_k, payload_format) -> the dispatch bytes per token the caller sizes for
    dispatch_bytes_per_token: Callable[[int, int, str], int] = dispatch_bytes_per_token
    # The caller passes cap x ep_size as max_num_tokens (which FlashInfer multiplies by ep_size again).
    tokens_for_group: bool = False
    draft: bool = False  # a speculative draft model's dispatcher
    namespace_bytes: int = 0  # bytes the caller adds to the workspace (a draft dispatcher's own cache entry)
    # (the release, the EPLB stats experts) -> what the caller refuses of them, in words; None: nothing
    refusal: Callable[[FlashInferVersion, int], str | None] = lambda version, eplb_stats_num_experts: None


FLASHINFER_FORMULA = Allocation("flashinfer")  # FlashInfer's own formula for the payload format and release


class NoCapFits(SizingError):
    """The budget is below the workspace of the smallest aligned cap."""


@dataclass(frozen=True)
class WorkspacePlan:
    # inputs
    model: str
    hidden_size: int
    top_k: int
    num_experts: int
    ep_size: int
    cap: int  # tokens per rank per dispatch (the engine's per-rank cap)
    payload_format: str
    eplb_stats_num_experts: int
    flashinfer_version: str
    layout: str  # "moe_a2a" or "nvlink_one_sided"
    mode: str
    draft: bool
    # what FlashInfer is told and what it allocates
    max_num_tokens: int  # cap, or cap * ep_size where the allocation passes that
    dispatch_bytes_per_token: int  # hidden payload + scales + int32 ids + fp32 weights
    combine_bytes_per_token: int
    aux_bytes: int  # control and routing regions
    dispatch_region_bytes: int
    combine_region_bytes: int
    lamport_bytes: int  # 0.7.4 Lamport transport regions (0 when off)
    namespace_bytes: int  # what the caller adds (a draft dispatcher's own cache entry)
    workspace_bytes_per_rank: int
    workspace_bytes_group: int  # all ep_size ranks together
    expert_rows: int  # ep_size * max_num_tokens: receive rows handed to the expert kernel
    cft: bool = False  # 0.7.4: CFT's combine receive inbox and counters sized in (combine_region_bytes, aux_bytes)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_workspace(
    geometry: ModelGeometry,
    ep_size: int,
    cap: int,
    payload_format: str = "bf16",
    eplb_stats_num_experts: int = 0,
    flashinfer_version: str | None = None,
    allocation: Allocation = FLASHINFER_FORMULA,
    *,
    lamport_max_tokens: int = 0,
    cft: bool = False,
    bytes_per_token: tuple[int, int] | None = None,
) -> WorkspacePlan:
    """The workspace one rank allocates for ``cap`` tokens per rank. Raises ``SizingError``.

    The one pricing function: ``capwatch plan``, the rank's reported config (``rank_config``), the
    service's views and the advisor's budget and what-if all price through here, for every layout.
    ``bytes_per_token``: the (dispatch, combine) bytes per token a rank passes to ``moe_a2a`` (it
    reports them; the allocation's rule otherwise). ``NVLinkOneSidedAlltoAll`` (0.7.4) derives its own
    from the geometry and the format, so the layout prices it from those.
    """
    version = FlashInferVersion.parse(flashinfer_version)
    check_payload_format(payload_format)
    check_ep_size(ep_size, version)
    FLASHINFER.check_cap(cap)
    check_eplb_stats(eplb_stats_num_experts, version)
    check_routing(geometry.top_k, geometry.num_experts, ep_size, version, eplb_stats_num_experts)
    hidden_bytes_per_token(geometry.hidden_size, payload_format)  # the format must fit the hidden size
    refusal = allocation.refusal(version, eplb_stats_num_experts)
    if refusal is not None:
        raise SizingError(refusal)
    if not 0 <= lamport_max_tokens <= LAMPORT_MAX_TOKENS_PER_RANK:
        raise SizingError(f"the Lamport token limit must be 0..{LAMPORT_MAX_TOKENS_PER_RANK} (FlashInfer's "
                          f"kLamportMaxTokensPerRank), got {lamport_max_tokens}")
    if (lamport_max_tokens or cft) and version.layout == LAYOUT_MOE_A2A:
        raise SizingError(
            f"the Lamport transport and CFT exist only in flashinfer 0.7.4's NVLinkOneSidedAlltoAll, "
            f"not in {version.version}"
        )

    hidden, top_k = geometry.hidden_size, geometry.top_k
    combine = combine_bytes_per_token(hidden)
    max_num_tokens = cap * ep_size if allocation.tokens_for_group else cap
    check_max_num_tokens(max_num_tokens, "cap * ep_size" if allocation.tokens_for_group else "cap")
    lamport_bytes = namespace_bytes = 0
    if version.layout == LAYOUT_MOE_A2A:
        dispatch = allocation.dispatch_bytes_per_token(hidden, top_k, payload_format)
        namespace_bytes = allocation.namespace_bytes
        if bytes_per_token is not None:
            dispatch, combine = (check_positive(name, value) for name, value in zip(
                ("dispatch_bytes_per_token", "combine_bytes_per_token"), bytes_per_token))
        layout = workspace_layout(ep_size, max_num_tokens, dispatch, combine, eplb_stats_num_experts,
                                  version.version)
        aux, dispatch_region, combine_region = layout.aux_bytes, layout.dispatch_region_bytes, \
            layout.combine_region_bytes
        per_rank = layout.workspace_bytes_per_rank + namespace_bytes
    else:
        dispatch = hidden_bytes_per_token(hidden, payload_format) + routing_bytes_per_token(top_k)
        nvlink = nvlink_one_sided_layout(ep_size, max_num_tokens, top_k, hidden, payload_format,
                                         eplb_stats_num_experts, cft=cft, lamport_max_tokens=lamport_max_tokens)
        aux, dispatch_region = nvlink.aux_bytes, nvlink.dispatch_payload_bytes
        combine_region = nvlink.combine_input_bytes + nvlink.combine_recv_bytes
        lamport_bytes, per_rank = nvlink.lamport_bytes, nvlink.workspace_bytes_per_rank
    return WorkspacePlan(
        model=geometry.name, hidden_size=hidden, top_k=top_k, num_experts=geometry.num_experts,
        ep_size=ep_size, cap=cap, payload_format=payload_format,
        eplb_stats_num_experts=eplb_stats_num_experts, flashinfer_version=version.version,
        layout=version.layout, mode=allocation.mode, draft=allocation.draft, max_num_tokens=max_num_tokens,
        dispatch_bytes_per_token=dispatch, combine_bytes_per_token=combine, aux_bytes=aux,
        dispatch_region_bytes=dispatch_region, combine_region_bytes=combine_region,
        lamport_bytes=lamport_bytes, namespace_bytes=namespace_bytes,
        workspace_bytes_per_rank=per_rank, workspace_bytes_group=per_rank * ep_size,
        expert_rows=ep_size * max_num_tokens, cft=cft,
    )


def largest_plan_within(
    budget_bytes: int,
    geometry: ModelGeometry,
    ep_size: int,
    payload_format: str = "bf16",
    eplb_stats_num_experts: int = 0,
    flashinfer_version: str | None = None,
    allocation: Allocation = FLASHINFER_FORMULA,
    *,
    alignment: int = CAP_ALIGNMENT,
    max_cap: int | None = None,
    **layout_options,
) -> WorkspacePlan:
    """The plan of the largest multiple of ``alignment`` whose per-rank workspace fits the budget.

    The workspace grows monotonically with the cap: ``largest_aligned_cap``'s search, each plan made once.
    ``max_cap``: search no higher (default: the largest cap capwatch sizes, ``FLASHINFER.max_cap_tokens``).
    Raises ``NoCapFits`` when not even ``alignment`` tokens fit (or ``alignment`` is above ``max_cap``).
    """
    check_positive("budget_bytes", budget_bytes)
    plans: dict[int, WorkspacePlan] = {}

    def fits(cap: int) -> bool:
        plans[cap] = plan_workspace(geometry, ep_size, cap, payload_format, eplb_stats_num_experts,
                                    flashinfer_version, allocation, **layout_options)
        return plans[cap].workspace_bytes_per_rank <= budget_bytes

    token_limit = INT32_MAX // ep_size if allocation.tokens_for_group else INT32_MAX
    largest = min(token_limit, FLASHINFER.max_cap_tokens)
    if max_cap is not None:
        largest = min(largest, max_cap)
    cap = largest_aligned_cap(fits, alignment, largest)
    if cap is not None:
        return plans[cap]
    if alignment > largest:
        raise NoCapFits(f"no cap fits: the smallest aligned cap, {alignment}, is above the largest cap searched, "
                        f"{largest}; lower the alignment")
    raise NoCapFits(f"no cap fits {budget_bytes} bytes per rank: the smallest aligned cap, {alignment}, "
                    f"already needs {plans[alignment].workspace_bytes_per_rank} bytes")

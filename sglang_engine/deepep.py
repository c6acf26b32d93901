"""SGLang's side of DeepEP's low-latency buffer (``--moe-a2a-backend deepep``): the buffer SGLang allocates for a
cap, what it asserts of the cap and the experts, and what its automatic memory fraction sets aside for it.

SGLang 0.5.19 - 0.5.23, ``layers/moe/token_dispatcher/deepep.py`` ``DeepEPBuffer.get_deepep_buffer`` (the same
code in every one of them): one ``deep_ep.Buffer`` per process, built at the first dispatch and shared by every
MoE layer and by both dispatchers of two-batch overlap, with

- ``num_rdma_bytes`` = DeepEP's low-latency size hint for T = ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``
  (``sizing/deepep_low_latency.py``), the hidden size and the experts DeepEP is given; with ``--deepep-mode
  auto`` (the default) the larger of that and normal mode's RDMA hint;
- ``num_nvl_bytes`` = normal mode's NVLink buffer in auto mode (``sizing/deepep_normal.py``), 0 in low_latency.

The experts are the model's routed experts + ``--ep-num-redundant-experts`` + one slot per rank for each fused
shared expert (``--enforce-shared-experts-fusion``: ``deepseek_v2.py`` gives DeepEP ``n_routed_experts +
moe_ep_size``), and must divide by the group size (SGLang asserts it, as it asserts T <= 1024). SGLang also
sets ``NVSHMEM_QP_DEPTH`` to max(the environment's value or 1024, 2(T + 1)). Its automatic
``--mem-fraction-static`` reserves a flat 2048 MB for all of it whatever T is (``arg_groups/memory_hook.py``
``reserve_for_deepep_a2a_mb``, on servers that capture decode graphs). What the buffer costs beyond its bytes
(DeepEP's workspace, NVSHMEM's heap steps) and its pricing at any cap are DeepEP's: ``sizing/deepep_plan.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.caps import CAP_ALIGNMENT, align_up, largest_aligned_cap
from capwatch.sizing.checks import SizingError, check_integer, check_positive
from capwatch.sizing.deepep_low_latency import (
    BF16_BYTES,
    MAX_DISPATCH_TOKENS_PER_RANK,
    check_low_latency_hidden_size,
    low_latency_layout,
)
from capwatch.sizing.deepep_normal import normal_buffer_bytes
from capwatch.sizing.deepep_plan import NVSHMEM_HEAP_STEP_BYTES, DeepEPPricing, memory_bytes_per_rank
from capwatch.sizing.model_presets import ModelGeometry

DEEPEP_MODES: tuple[str, ...] = ("auto", "low_latency")  # --deepep-mode; normal has no low-latency buffer, no cap
MODE_SETTING = "deepep_mode"  # the server arg --deepep-mode, as the server's logged args name it
NVSHMEM_QP_DEPTH_DEFAULT = 1024  # sglang _NVSHMEM_QP_DEPTH_DEFAULT, DeepEP's own default too
RESERVE_BYTES = 2048 << 20  # reserve_for_deepep_a2a_mb: 2 * 1024 MB (SGLang's MB are MiB)

# SGLang's facts in DeepEP's cap rules (bound into sizing/deepep_plan.py's DEEPEP by sglang_engine/caps.py).
CAP_RULES = dict(
    required_alignment=128,
    why_aligned="a cap off a multiple of 128 corrupts DeepEP's FP8 scales (sglang#28994)",
    why_max=f"SGLang asserts the cap <= {MAX_DISPATCH_TOKENS_PER_RANK} at start-up",
    sized_by="DeepEP's size hints as SGLang adds them",
    mismatch_hint="check --deepep-config, the redundant and the fused shared experts",
)


class NoDeepEPCapFits(SizingError):
    """The budget is below the buffer of the smallest aligned cap."""


def check_cap(cap: int) -> int:
    """SizingError unless 1 <= cap <= 1024, the range SGLang accepts for DeepEP (``_DeepEPDispatcherImplBase``
    asserts it: the low-latency dispatch counts tokens below DeepEP's FINISHED_SUM_TAG)."""
    check_positive("cap", cap)
    if cap > MAX_DISPATCH_TOKENS_PER_RANK:
        raise SizingError(
            f"cap {cap} is above {MAX_DISPATCH_TOKENS_PER_RANK}, the most SGLang accepts for DeepEP's low-latency "
            f"dispatch (it asserts the cap <= {MAX_DISPATCH_TOKENS_PER_RANK} at start-up)")
    return cap


def buffer_experts(num_experts: int, ep_size: int, redundant_experts: int = 0, fused_shared_experts: int = 0) -> int:
    """The experts SGLang gives DeepEP: routed + redundant + one slot per rank per fused shared expert."""
    check_positive("num_experts", num_experts)
    check_positive("ep_size", ep_size)
    check_integer("redundant_experts", redundant_experts, 0)
    check_integer("fused_shared_experts", fused_shared_experts, 0)
    return num_experts + redundant_experts + fused_shared_experts * ep_size


def check_buffer_experts(experts: int, ep_size: int) -> int:
    if experts % ep_size:
        raise SizingError(f"{experts} experts do not divide among {ep_size} ranks: SGLang asserts "
                          "num_experts % ep_size == 0 for DeepEP (routed + redundant + fused shared slots)")
    return experts


def prefill_dispatched(deepep_mode: str) -> bool:
    """Whether prefill batches go through the low-latency buffer (and its cap): in low_latency mode; auto sends
    them to normal mode (``DeepEPMode.resolve``), which has no cap."""
    return deepep_mode == "low_latency"


def nvshmem_qp_depth(cap: int, environment_value: int | None = None) -> int:
    """The ``NVSHMEM_QP_DEPTH`` SGLang sets before building the buffer (``_set_nvshmem_qp_depth``)."""
    current = NVSHMEM_QP_DEPTH_DEFAULT if environment_value is None else environment_value
    return max(current, NVSHMEM_QP_DEPTH_DEFAULT, 2 * (cap + 1))


def settings_params(settings) -> tuple[tuple[str, object], ...]:
    """DeepEP's buffer beyond the model, from the server's args (``backends.spec.SettingsReader``): --deepep-mode,
    --ep-num-redundant-experts, and the fused shared expert slots of --enforce-shared-experts-fusion (DeepEP
    servers fuse only on request)."""
    return (("deepep_mode", settings.text(MODE_SETTING)),
            ("redundant_experts", settings.size("ep_num_redundant_experts", 0, least=0)),
            ("shared_experts_fusion",
             settings.flag("enforce_shared_experts_fusion") and not settings.flag("disable_shared_experts_fusion")))


@dataclass(frozen=True)
class DeepEPBufferPlan:
    # inputs
    model: str
    hidden_size: int  # (the buffer does not depend on top-k: every message slot holds one token for one expert)
    num_experts: int  # the model's routed experts
    ep_size: int
    cap: int  # SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK
    deepep_mode: str
    redundant_experts: int
    fused_shared_experts: int
    buffer_experts: int  # what DeepEP is given: routed + redundant + fused shared slots
    # the low-latency layout
    dispatch_message_bytes: int
    combine_message_bytes: int
    low_latency_rdma_bytes: int
    # normal mode (auto only; 0 in low_latency mode)
    normal_nvl_bytes: int
    normal_rdma_bytes: int
    # what SGLang passes to deep_ep.Buffer
    num_nvl_bytes: int
    num_rdma_bytes: int
    buffer_bytes_per_rank: int  # num_nvl_bytes + num_rdma_bytes
    buffer_bytes_group: int
    # around it
    nvshmem_qp_depth: int
    nvshmem_heap_bytes_at_least: int  # num_rdma_bytes rounded up to NVSHMEM's 512 MiB steps
    # what the rank's GPU gives up for it: the NVSHMEM heap the RDMA buffer takes (512 MiB steps), the NVLink
    # buffer and DeepEP's workspace; what a --budget is held against
    memory_bytes_per_rank: int
    sglang_reserve_bytes: int  # what SGLang's automatic memory fraction sets aside for all of it
    over_sglang_reserve_bytes: int  # buffer bytes beyond that reserve (0: within it)

    @property
    def reserve_bytes(self) -> int:
        """The engine's reserve for the buffer (the plan's JSON keeps SGLang's name for it)."""
        return self.sglang_reserve_bytes

    @property
    def over_reserve_bytes(self) -> int:
        return self.over_sglang_reserve_bytes

    def as_dict(self) -> dict:
        return asdict(self)


def plan_deepep_buffer(geometry: ModelGeometry, ep_size: int, cap: int, deepep_mode: str = "auto",
                       redundant_experts: int = 0, fused_shared_experts: int = 0, *,
                       qp_depth_environment: int | None = None) -> DeepEPBufferPlan:
    """The buffer one rank allocates for ``cap`` tokens per rank. Raises ``SizingError`` for what SGLang or
    DeepEP refuse (a hidden size without kernels, a cap above 1024, experts that do not divide, a group size
    without a normal-mode config in auto mode)."""
    if deepep_mode not in DEEPEP_MODES:
        raise SizingError(f"unknown DeepEP mode {deepep_mode!r}; choose one of {', '.join(DEEPEP_MODES)} "
                          "(normal mode has no low-latency buffer and no token cap)")
    check_cap(cap)
    check_low_latency_hidden_size(geometry.hidden_size)
    experts = check_buffer_experts(buffer_experts(geometry.num_experts, ep_size, redundant_experts,
                                                  fused_shared_experts), ep_size)
    layout = low_latency_layout(cap, geometry.hidden_size, experts)
    normal_nvl = normal_rdma = 0
    if deepep_mode == "auto":
        normal_nvl, normal_rdma = normal_buffer_bytes(geometry.hidden_size * BF16_BYTES, ep_size)
    pricing = DeepEPPricing(ep_size, geometry.hidden_size, experts, normal_nvl, normal_rdma)
    per_rank = pricing.bytes_per_rank(cap)
    num_rdma = per_rank - normal_nvl
    return DeepEPBufferPlan(
        model=geometry.name, hidden_size=geometry.hidden_size, num_experts=geometry.num_experts, ep_size=ep_size,
        cap=cap, deepep_mode=deepep_mode,
        redundant_experts=redundant_experts, fused_shared_experts=fused_shared_experts, buffer_experts=experts,
        dispatch_message_bytes=layout.dispatch_message_bytes, combine_message_bytes=layout.combine_message_bytes,
        low_latency_rdma_bytes=layout.rdma_bytes, normal_nvl_bytes=normal_nvl, normal_rdma_bytes=normal_rdma,
        num_nvl_bytes=normal_nvl, num_rdma_bytes=num_rdma, buffer_bytes_per_rank=per_rank,
        buffer_bytes_group=per_rank * ep_size,
        nvshmem_qp_depth=nvshmem_qp_depth(cap, qp_depth_environment),
        nvshmem_heap_bytes_at_least=align_up(num_rdma, NVSHMEM_HEAP_STEP_BYTES),
        memory_bytes_per_rank=memory_bytes_per_rank(num_rdma, normal_nvl),
        sglang_reserve_bytes=RESERVE_BYTES,
        over_sglang_reserve_bytes=max(0, per_rank - RESERVE_BYTES),
    )


def largest_deepep_plan_within(budget_bytes: int, geometry: ModelGeometry, ep_size: int, deepep_mode: str = "auto",
                               redundant_experts: int = 0, fused_shared_experts: int = 0, *,
                               alignment: int = CAP_ALIGNMENT) -> DeepEPBufferPlan:
    """The plan of the largest multiple of ``alignment`` (at most 1024) whose memory per rank (the NVSHMEM heap
    its RDMA buffer takes, the NVLink buffer, DeepEP's workspace: ``memory_bytes_per_rank``) fits
    ``budget_bytes``; ``NoDeepEPCapFits`` when not even ``alignment`` tokens fit."""
    check_positive("budget_bytes", budget_bytes)

    def plan(cap: int) -> DeepEPBufferPlan:
        return plan_deepep_buffer(geometry, ep_size, cap, deepep_mode, redundant_experts, fused_shared_experts)

    smallest = plan(alignment) if alignment <= MAX_DISPATCH_TOKENS_PER_RANK else None
    cap = largest_aligned_cap(lambda cap: plan(cap).memory_bytes_per_rank <= budget_bytes, alignment,
                              MAX_DISPATCH_TOKENS_PER_RANK)
    if cap is None:
        needed = f"already needs {smallest.memory_bytes_per_rank} bytes (its buffer's NVSHMEM heap, NVLink buffer " \
                 "and DeepEP's workspace)" if smallest else f"is above DeepEP's {MAX_DISPATCH_TOKENS_PER_RANK}"
        raise NoDeepEPCapFits(f"no cap fits {budget_bytes} bytes per rank: the smallest aligned cap, {alignment}, "
                              f"{needed}")
    return plan(cap)


# --- capwatch plan --backend deepep: the words about SGLang's reserve ----------------------------------------

RESERVE_COLUMN = f"vs SGLang's {RESERVE_BYTES >> 20} MB"  # the table's column: each cap's buffer against it


def reserve_warning(plan: DeepEPBufferPlan, cap_variable: str) -> str:
    """What ``plan``'s buffer outgrowing SGLang's reserve costs, and what to do."""
    return (f"warning: from cap {plan.cap} the buffer ({format_gib(plan.buffer_bytes_per_rank)} per rank) "
            f"outgrows the {format_gib(plan.sglang_reserve_bytes)} SGLang's automatic --mem-fraction-static "
            f"reserves for DeepEP whatever {cap_variable} is: set --mem-fraction-static lower by the "
            "difference or expect the KV pool or CUDA-graph capture to run out of memory")

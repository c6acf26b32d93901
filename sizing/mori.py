"""What a per-rank cap costs in MoRI's dispatch/combine op as SGLang builds it (``--moe-a2a-backend mori``, EPv1).

SGLang 0.5.19 - 0.5.23 ``token_dispatcher/moriep.py`` ``init_mori_op`` builds one ``mori.ops.EpDispatchCombineOp``
per distinct configuration (``lru_cache``: the layers share it; two-batch overlap's micro-batches have their own
``instance_id``) from ``EpDispatchCombineConfig(max_num_inp_token_per_rank=T, ...)`` with T =
``SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` (default 4096), the token bytes of the parameters' dtype (bf16:
2) whatever the dispatch dtype, ``num_qp_per_pe=2`` and ``gpu_per_node`` = min(ep_size, 8).

MoRI has no size function and its op reports no bytes: the allocations are C++ (``EpDispatchCombineHandle``'s
``InitializeShmemBuf``, ``InitializeTokenNumSignalBuf``, ``InitializeOrderMapBuf``), which need a ROCm GPU. They
are transcribed here from the source of the MoRI release v1.2.2 (ROCm/mori ``src/ops/dispatch_combine/
dispatch_combine.cpp`` and ``include/mori/ops/dispatch_combine/dispatch_combine.hpp``), not checked against a
compiled MoRI (nothing here runs one); other MoRI releases size differently (before v1.2 the send side held
T x top-k tokens). With R = ep_size x T received tokens (fewer with ``max_total_recv_tokens``), B the token bytes,
k the top-k, E the experts per rank::

    transfer bytes per token   H*B + 4k (indices) + 4k (weights) + 4 (source id) + scale_dim*scale_type_size
    IntraNode                  combine input R*transfer (blockwise combine: R*(token region + 8k + 4 + 56*4))
                               + dispatch output R*H*B + combine output T*H*B
    InterNodeV1 / V1LL         + dispatch input n*T*transfer, staging 2n*T*transfer, dispatch staging T*transfer
                               (n = ep_size / gpu_per_node)
    AsyncLL (low latency)      dispatch input, combine input and staging of ep_size*T*transfer each
                               + dispatch output R*H*B + combine output T*H*B
    every kernel               weights 3*R*4k, scales R*scale bytes (in and out), indices 2*R*4k,
                               token-count signals, and the order maps (5 + 1 of ep_size*T*E int32s, ...)

The receive side is sized for T from every rank: each rank's own batch must fit T, and nothing checks it.
A batch above T writes past the buffers (ROCm/mori#356): silent corruption, not an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import PricedByFormula
from capwatch.sizing.checks import MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS, SizingError, check_integer, check_positive

# The engine's setting that shrinks the receive side (max_total_recv_tokens; 0, its default: every rank's T).
PREALLOC_RECV_VARIABLE = "the receive-token prealloc (max_total_recv_tokens)"
MORI_VERSION = "1.2.2"  # the MoRI source the allocations are transcribed from
KERNEL_TYPES: tuple[str, ...] = ("IntraNode", "InterNodeV1", "InterNodeV1LL", "AsyncLL")  # what the server builds
COMBINE_QUANTS: tuple[str, ...] = ("none", "fp8_direct_cast", "fp8_blockwise", "fp4_blockwise")
BLOCKWISE_COMBINE_QUANTS = ("fp8_blockwise", "fp4_blockwise")
BLOCKWISE_COMBINE_SCALE_DIM = 56  # kDefaultFp8BlockwiseScaleDim (MORI_FP8_COMBINE_SCALE_DIM overrides it)
INDEX_BYTES = 4  # index_t = int32_t
FLOAT_BYTES = 4
SIGNAL_BYTES = 8  # int64_t / uint64_t
QPS_PER_PE = 2  # the server's num_qp_per_pe
GPUS_PER_NODE = 8  # the server's gpu_per_node: 8 if ep_size >= 8 else ep_size
# The server picks InterNodeV1LL up to this cap on more than 8 ranks (its inter-kernel switch threshold).
INTER_KERNEL_SWITCH_THRESHOLD = 256

MORI = BackendCapRules(
    "mori",
    below_floor=("below it a batch writes past MoRI's buffers and corrupts memory silently (ROCm/mori#356; the "
                 "server checks only the prefill chunk at start-up, not the decode batch: #37964)"),
    eager_prefill_dispatched=True, local_batch_cap=True,
    overflow_outcome=("MoRI would write past its buffers and corrupt memory silently (ROCm/mori#356), so capwatch "
                      "refuses the dispatch and the rank ends"),
    memory="buffers", sized_by=f"MoRI v{MORI_VERSION}'s allocations as the server configures them",
    mismatch_hint=f"check the MoRI release (capwatch transcribes v{MORI_VERSION}), {PREALLOC_RECV_VARIABLE} and "
                  "MORI_FP8_COMBINE_SCALE_DIM")


def kernel_type(ep_size: int, cap: int, low_latency: bool,
                switch_threshold: int = INTER_KERNEL_SWITCH_THRESHOLD) -> str:
    """The kernel SGLang's ``init_mori_op`` picks: AsyncLL in low-latency mode, else IntraNode on up to 8 ranks,
    InterNodeV1LL (cap up to the switch threshold) or InterNodeV1 beyond."""
    if low_latency:
        return "AsyncLL"
    if ep_size <= GPUS_PER_NODE:
        return "IntraNode"
    return "InterNodeV1LL" if cap <= switch_threshold else "InterNodeV1"


@dataclass(frozen=True)
class MoriOpConfig:
    """What prices one MoRI op beyond the cap: the fields of ``EpDispatchCombineConfig`` SGLang sets."""

    ep_size: int
    hidden_size: int
    top_k: int
    experts_per_rank: int  # num_local_experts
    kernel: str = "IntraNode"
    token_bytes: int = 2  # max_token_type_size: the parameters' dtype (bf16)
    scale_dim: int = 0  # per token: 0 (bf16 dispatch), H / 128 (fp8), H / 32 (fp4, mxfp8)
    scale_type_size: int = 0  # 4 (fp32 scales) or 1 (e8m0)
    combine_quant: str = "none"
    max_total_recv_tokens: int = 0  # PREALLOC_RECV_VARIABLE (0: every rank's T)

    def __post_init__(self):
        check_positive("ep_size", self.ep_size)
        check_positive("hidden_size", self.hidden_size)
        check_positive("top_k", self.top_k)
        check_positive("experts_per_rank", self.experts_per_rank)
        check_positive("token_bytes", self.token_bytes)
        for name in ("scale_dim", "scale_type_size", "max_total_recv_tokens"):
            check_integer(name, getattr(self, name), 0)
        if self.hidden_size > MAX_HIDDEN_SIZE or self.experts_per_rank > MAX_NUM_EXPERTS:
            raise SizingError(f"hidden size {self.hidden_size} or {self.experts_per_rank} experts per rank is beyond "
                              "any real model")
        if self.kernel not in KERNEL_TYPES:
            raise SizingError(f"unknown MoRI kernel {self.kernel!r}; the server builds {', '.join(KERNEL_TYPES)}")
        if self.combine_quant not in COMBINE_QUANTS:
            raise SizingError(f"unknown MoRI combine quantization {self.combine_quant!r}; one of "
                              f"{', '.join(COMBINE_QUANTS)}")
        if self.kernel.startswith("InterNode") and self.ep_size % GPUS_PER_NODE:
            raise SizingError(f"MoRI's inter-node kernels need whole nodes of {GPUS_PER_NODE} GPUs; ep_size "
                              f"{self.ep_size} is not a multiple")

    @property
    def gpu_per_node(self) -> int:
        return GPUS_PER_NODE if self.ep_size >= GPUS_PER_NODE else self.ep_size

    def transfer_bytes_per_token(self) -> int:
        """``MaxXferBytesPerToken``: the token, its expert indices and weights, its source id, its scales."""
        return (self.hidden_size * self.token_bytes + self.top_k * INDEX_BYTES + self.top_k * FLOAT_BYTES
                + INDEX_BYTES + self.scale_dim * self.scale_type_size)

    def received_tokens(self, cap: int) -> int:
        """``MaxNumTokensToRecv``: ep_size x T, or the prealloc cap spread over the ranks when it is smaller."""
        per_rank = cap
        if self.max_total_recv_tokens > 0:
            per_rank = min(-(-self.max_total_recv_tokens // self.ep_size), cap)
        return self.ep_size * per_rank


@dataclass(frozen=True)
class MoriOpPlan:
    """One op's allocations at a cap (bytes per rank)."""

    cap: int
    kernel: str
    transfer_bytes_per_token: int
    received_tokens: int
    token_buffers_bytes: int  # dispatch/combine inputs, outputs and staging
    weights_scales_indices_bytes: int
    signals_bytes: int
    order_maps_bytes: int
    op_bytes: int  # all of it: what one op holds per rank

    def as_dict(self) -> dict:
        return asdict(self)


def mori_op_plan(config: MoriOpConfig, cap: int) -> MoriOpPlan:
    """MoRI v1.2.2's allocations for ``config`` at ``cap`` tokens per rank."""
    check_positive("cap", cap)
    ep, hidden, top_k, token = config.ep_size, config.hidden_size, config.top_k, config.token_bytes
    transfer, received = config.transfer_bytes_per_token(), config.received_tokens(cap)
    nodes = ep // config.gpu_per_node
    combine_output = cap * hidden * token  # MaxNumTokensToSendPerRank x H x B
    dispatch_output = received * hidden * token
    combine_input = received * transfer
    if config.kernel == "IntraNode" and config.combine_quant in BLOCKWISE_COMBINE_QUANTS:
        region = (hidden + 1) // 2 if config.combine_quant == "fp4_blockwise" else hidden * token
        combine_input = received * (region + top_k * INDEX_BYTES + top_k * FLOAT_BYTES + INDEX_BYTES
                                    + BLOCKWISE_COMBINE_SCALE_DIM * FLOAT_BYTES)
    if config.kernel == "IntraNode":
        tokens = combine_input + dispatch_output + combine_output
    elif config.kernel in ("InterNodeV1", "InterNodeV1LL"):
        tokens = (nodes * cap * transfer + combine_input + 2 * nodes * cap * transfer + dispatch_output
                  + combine_output + cap * transfer)
    else:  # AsyncLL: every staging buffer sized for all ranks' tokens (no overflow protection in the async kernel)
        tokens = 3 * ep * cap * transfer + dispatch_output + combine_output
    user_scales = received * config.scale_dim * config.scale_type_size if config.scale_dim and \
        config.scale_type_size else 0
    blockwise_scales = received * BLOCKWISE_COMBINE_SCALE_DIM * FLOAT_BYTES \
        if config.combine_quant in BLOCKWISE_COMBINE_QUANTS else 0
    rest = (3 * received * top_k * FLOAT_BYTES + max(user_scales, blockwise_scales) + user_scales
            + 2 * received * top_k * INDEX_BYTES)
    signals = 2 * ep * INDEX_BYTES * 2 * QPS_PER_PE + 2 * ep * SIGNAL_BYTES * 2 + INDEX_BYTES + nodes * SIGNAL_BYTES
    out_tokens = ep * cap * config.experts_per_rank  # MaxNumTokensToSend x numExpertPerRank
    maps = (6 * out_tokens * INDEX_BYTES + 2 * ep * INDEX_BYTES + 2 * nodes * INDEX_BYTES + INDEX_BYTES
            + nodes * cap * top_k * INDEX_BYTES + nodes * cap * INDEX_BYTES)
    return MoriOpPlan(cap=cap, kernel=config.kernel, transfer_bytes_per_token=transfer, received_tokens=received,
                      token_buffers_bytes=tokens, weights_scales_indices_bytes=rest, signals_bytes=signals,
                      order_maps_bytes=maps, op_bytes=tokens + rest + signals + maps)


@dataclass(frozen=True)
class MoriPricing(PricedByFormula):
    """A MoRI group's op per rank at any cap (the kernel fixed: SGLang's switch between InterNodeV1LL and
    InterNodeV1 at 256 tokens moves with the cap, so the inter-node kernel follows it)."""

    MAX_CAP = MORI.max_cap_tokens

    ep_size: int
    config: MoriOpConfig | None  # None: not known (then nothing prices)

    def config_at(self, cap: int) -> MoriOpConfig:
        if self.config is None:
            raise SizingError("the MoRI op's geometry is not known, so it cannot be priced")
        config = self.config
        if config.kernel.startswith("InterNode"):
            config = MoriOpConfig(**{**asdict(config), "kernel": kernel_type(config.ep_size, cap, False)})
        return config

    def bytes_per_rank(self, cap: int) -> int:
        MORI.check_cap(cap)
        return mori_op_plan(self.config_at(cap), cap).op_bytes

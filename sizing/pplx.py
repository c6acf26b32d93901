"""What a per-rank cap costs in pplx-kernels' ``AllToAll`` as the server builds it (``--moe-a2a-backend pplx``).

The server builds one ``pplx_kernels.AllToAll`` per process (every layer and micro-batch shares it) with
``max_num_tokens`` = T, the cap, ``num_experts``, ``experts_per_token`` (top-k), ``world_size`` (the EP group,
the whole world), ``dp_size`` (the attention-TP size: the ranks of one DP group), ``hidden_dim``,
``hidden_dim_bytes`` (H x 1 for an fp8 dispatch, H x the parameters' element size otherwise) and
``hidden_dim_scale_bytes`` (fp8: one fp32 per 128 channels, ceil(H / 128) x 4; else 0): ``AllToAll.intranode``
on one node, ``AllToAll.internode`` (NVSHMEM) across nodes.

pplx-kernels has no size function and reports no bytes: the allocations are C++ constructors that need a GPU
(and NVSHMEM across nodes). They are plain arithmetic, transcribed here from pplx-kernels' source at commit
2bd6e30 (master, 2025-09-19, "NVSHMEM4Py Integration", pyproject version 0.0.1: the project publishes no
releases or tags; this is the first commit whose Python API — ``nvshmem_init(global_rank=, local_rank=,
world_size=, device=)``, ``PyTorchStreamWrapper`` — is the one the server imports), not checked against a
compiled pplx-kernels (nothing here runs one). With L = ceil(E / W) local experts, G = ceil(W / dp_size) DP
groups, P = round_up(hidden_dim_bytes + hidden_dim_scale_bytes + 4, 16) bytes per dispatched token::

    intranode (csrc/all_to_all/intranode.cpp:35-136, cudaMalloc)
      W send buffers of max(dispatch, combine) bytes each, peers' opened over CUDA IPC (their memory, not ours):
        dispatch = 16 + round_up(4L, 16) + T*L*P
        combine  = 16 + round_up(4L, 16) + T*L*round_up(4H, 16)
      + 3 pointer arrays of 8W, the receive counts 4T, token counts 4E, per-rank counts 4*L*W,
      + 6 tracking arrays of 4*(L*T*W) and a 4-byte token index
    internode (csrc/all_to_all/internode.cpp:34-76)
      NVSHMEM's symmetric heap: counts 2 x 8*L*G, combine signals 8T, sync 8W, dispatch in T*P, dispatch out
        (L*G*T)*P, combine in (L*G*T)*4H, combine out T*E*4H
      + cudaMalloc: per-DP counts 4*L*G, 5 tracking arrays of 4*(L*G*T) and a 4-byte token index

The bytes are what the constructors request; the CUDA allocator's rounding and NVSHMEM's heap reservation
(``NVSHMEM_SYMMETRIC_SIZE``, which must hold the internode buffers) are not in them. What the server's own
``dispatch_a`` and ``combine_a`` allocate per call around the ``AllToAll`` (the experts' input, L x (T x the DP
groups) x H, and the combined output, T x H) is torch's memory, not the buffers', and is not priced here.

Each rank's own batch must fit T: the server asserts it before each dispatch and combine (and the kernels trap on
``numSendTokens <= maxNumTokens``), so a batch above T ends the rank with an assertion naming the variable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import PricedByFormula
from capwatch.sizing.checks import MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS, SizingError, check_integer, check_positive

PPLX_COMMIT = "2bd6e30"  # perplexityai/pplx-kernels: the source the allocations are transcribed from
TRANSPORTS: tuple[str, ...] = ("intranode", "internode")  # AllToAll.intranode (CUDA IPC), .internode (NVSHMEM)
FP8_BLOCK_SIZE = 128  # channels per fp32 dispatch scale (the server's _FP8_BLOCK_SIZE)
ALIGN = 16  # int4: the per-token stride and the count regions' alignment
INDEX_BYTES = 4  # uint32_t
SIGNAL_BYTES = 8  # uint64_t
POINTER_BYTES = 8
COMBINE_ELEMENT_BYTES = 4  # combine buffers hold float, "wider to accommodate all possible data types"
INTRANODE_TRACKING_ARRAYS = 6  # sourceIndex, sourceExpert, sourceOffset, sourceRank, sourceToken, sourceRoute
INTERNODE_TRACKING_ARRAYS = 5  # sourceIndex, sourceExpert, sourceOffset, sourceGroup, sourceToken

PPLX = BackendCapRules(
    "pplx",
    eager_prefill_dispatched=True, local_batch_cap=True,  # low-latency mode only: every batch meets the cap
    overflow_outcome="the engine's assertion ends the rank before pplx-kernels sees the batch",
    memory="buffers", sized_by=f"pplx-kernels' AllToAll allocations (commit {PPLX_COMMIT}) as the server builds it",
    mismatch_hint=f"check the pplx-kernels build (capwatch transcribes commit {PPLX_COMMIT}), the dispatch dtype "
                  "and the attention-TP size the AllToAll was built with")


def round_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def fp8_scale_bytes(hidden_size: int) -> int:
    """``hidden_dim_scale_bytes`` of an fp8 dispatch: one fp32 scale per 128 channels."""
    return -(-hidden_size // FP8_BLOCK_SIZE) * 4


@dataclass(frozen=True)
class PplxConfig:
    """What prices one ``AllToAll`` beyond the cap: the arguments the server passes to it."""

    world_size: int  # the EP group: the whole world
    dp_size: int  # the attention-TP size (ranks per DP group)
    num_experts: int
    hidden_size: int
    hidden_dim_bytes: int
    hidden_dim_scale_bytes: int = 0
    transport: str = "intranode"

    def __post_init__(self):
        for name in ("world_size", "dp_size", "num_experts", "hidden_size", "hidden_dim_bytes"):
            check_positive(name, getattr(self, name))
        check_integer("hidden_dim_scale_bytes", self.hidden_dim_scale_bytes, 0)
        if self.hidden_size > MAX_HIDDEN_SIZE or self.num_experts > MAX_NUM_EXPERTS:
            raise SizingError(f"hidden size {self.hidden_size} or {self.num_experts} experts is beyond any real model")
        if self.transport not in TRANSPORTS:
            raise SizingError(f"unknown pplx transport {self.transport!r}; the server builds {', '.join(TRANSPORTS)}")
        # AllToAll.intranode/internode (Python) and the C++ constructor's PPLX_ASSERTs (which trap the process).
        if self.world_size % self.dp_size or self.world_size // self.dp_size < 2:
            raise SizingError(f"pplx-kernels needs at least 2 DP groups dividing the group: {self.world_size} ranks "
                              f"with {self.dp_size} per DP group (the attention-TP size) is refused")
        for name in ("hidden_dim_bytes", "hidden_dim_scale_bytes"):
            if getattr(self, name) % ALIGN:
                raise SizingError(f"pplx-kernels traps on {name} {getattr(self, name)}: it must be a multiple of "
                                  f"{ALIGN}")
        if self.hidden_dim_scale_bytes > self.hidden_dim_bytes:
            raise SizingError("pplx-kernels traps on scale bytes above the token bytes")

    @property
    def local_experts(self) -> int:  # numLocalExperts = ceil_div(numExperts, worldSize)
        return -(-self.num_experts // self.world_size)

    @property
    def dp_groups(self) -> int:  # numDPGroups = ceil_div(worldSize, dpSize)
        return -(-self.world_size // self.dp_size)

    def dispatch_bytes_per_token(self) -> int:
        """A dispatched token's slot: the token, its scales and a uint32 index, padded to 16."""
        return round_up(self.hidden_dim_bytes + self.hidden_dim_scale_bytes + INDEX_BYTES, ALIGN)


@dataclass(frozen=True)
class PplxPlan:
    """One ``AllToAll``'s allocations at a cap (bytes per rank)."""

    cap: int
    transport: str
    dispatch_bytes_per_token: int
    token_buffers_bytes: int  # the send buffers (intranode) or dispatch/combine in/out (internode)
    symmetric_heap_bytes: int  # of which in NVSHMEM's symmetric heap (internode; 0 intranode)
    counts_and_tracking_bytes: int  # counts, signals, pointers and the dispatch-to-combine tracking
    all_to_all_bytes: int  # all of it: what the AllToAll holds per rank

    def as_dict(self) -> dict:
        return asdict(self)


def pplx_plan(config: PplxConfig, cap: int) -> PplxPlan:
    """pplx-kernels' ``AllToAll`` allocations for ``config`` at ``cap`` tokens per rank (commit 2bd6e30)."""
    check_positive("cap", cap)
    tokens, world, experts, hidden = cap, config.world_size, config.num_experts, config.hidden_size
    local, groups, per_token = config.local_experts, config.dp_groups, config.dispatch_bytes_per_token()
    if config.transport == "intranode":
        counts_region = ALIGN + round_up(local * INDEX_BYTES, ALIGN)  # sizeof(int4) + the per-expert counts
        dispatch = counts_region + tokens * local * per_token
        combine = counts_region + tokens * local * round_up(hidden * COMBINE_ELEMENT_BYTES, ALIGN)
        buffers = world * max(dispatch, combine)
        heap = 0
        batch_tokens = local * tokens * world
        rest = (3 * POINTER_BYTES * world + INDEX_BYTES * tokens + INDEX_BYTES * experts
                + INDEX_BYTES * local * world + INTRANODE_TRACKING_ARRAYS * INDEX_BYTES * batch_tokens + INDEX_BYTES)
    else:
        batch_tokens = local * groups * tokens
        buffers = (tokens * per_token + batch_tokens * per_token + batch_tokens * hidden * COMBINE_ELEMENT_BYTES
                   + tokens * experts * hidden * COMBINE_ELEMENT_BYTES)
        signals = 2 * SIGNAL_BYTES * local * groups + SIGNAL_BYTES * tokens + SIGNAL_BYTES * world
        heap = buffers + signals
        rest = signals + INDEX_BYTES * local * groups + INTERNODE_TRACKING_ARRAYS * INDEX_BYTES * batch_tokens \
            + INDEX_BYTES
    return PplxPlan(cap=cap, transport=config.transport, dispatch_bytes_per_token=per_token,
                    token_buffers_bytes=buffers, symmetric_heap_bytes=heap, counts_and_tracking_bytes=rest,
                    all_to_all_bytes=buffers + rest)


@dataclass(frozen=True)
class PplxPricing(PricedByFormula):
    """A pplx group's ``AllToAll`` per rank at any cap (None: its arguments are not known, then nothing prices)."""

    MAX_CAP = PPLX.max_cap_tokens

    ep_size: int
    config: PplxConfig | None

    def bytes_per_rank(self, cap: int) -> int:
        PPLX.check_cap(cap)
        if self.config is None:
            raise SizingError("the pplx AllToAll's arguments are not known, so it cannot be priced")
        return pplx_plan(self.config, cap).all_to_all_bytes

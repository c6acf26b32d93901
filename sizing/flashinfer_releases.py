"""Every flashinfer-python release with the MoE A2A, and what each accepts as far as sizing goes:
its workspace layout (``flashinfer_moe_a2a`` up to 0.7.2.post1, ``flashinfer_one_sided`` in 0.7.4),
kMaxTopK, the EPLB stats region, expert divisibility and its rank limit. Sources: ``docs/sizing.md``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.checks import INT32_MAX, MAX_NUM_EXPERTS, SizingError, check_integer, check_positive

ALIGNMENT_BYTES = 128  # kCachelineAlignment: where both layouts start their regions
MAX_EP_SIZE = 64  # kMaxRanks of the moe_a2a layout

# Every flashinfer-python release that ships the MoE A2A, oldest first.
SUPPORTED_FLASHINFER_VERSIONS: tuple[str, ...] = (
    "0.6.0", "0.6.1", "0.6.2", "0.6.3", "0.6.4", "0.6.5", "0.6.6",
    "0.6.7", "0.6.7.post1", "0.6.7.post2", "0.6.7.post3",
    "0.6.8", "0.6.8.post1", "0.6.9", "0.6.10", "0.6.10.post1",
    "0.6.11", "0.6.11.post1", "0.6.11.post2", "0.6.11.post3",
    "0.6.12", "0.6.13", "0.6.14", "0.6.15", "0.6.15.post1",
    "0.6.16", "0.6.16.post1", "0.6.16.post2", "0.6.16.post3", "0.6.16.post4",
    "0.6.17", "0.6.18", "0.6.18.post1",
    "0.7.0", "0.7.0.post1", "0.7.1", "0.7.2", "0.7.2.post1", "0.7.4",
)
LATEST_FLASHINFER_VERSION = SUPPORTED_FLASHINFER_VERSIONS[-1]
# The newest release with ``MoeAlltoAll`` / ``moe_a2a_get_workspace_size_per_rank``: what SGLang
# (and capwatch's dispatcher) call, so the default wherever a version is left out.
DEFAULT_FLASHINFER_VERSION = "0.7.2.post1"

# The first release without ``flashinfer.comm.MoeAlltoAll`` and ``moe_a2a_*`` (only ``flashinfer.moe_ep``): what
# SGLang's FlashinferDispatcher calls up to sglang 0.5.23, so none of those releases can build it beside this one.
MOE_ALLTOALL_REMOVED_IN = "0.7.4"

LAYOUT_MOE_A2A = "moe_a2a"
LAYOUT_NVLINK_ONE_SIDED = "nvlink_one_sided"


def _release(version: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", version.strip())
    if not match:
        raise SizingError(f"flashinfer version {version!r} is not of the form X.Y.Z[.postN]")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


@dataclass(frozen=True)
class FlashInferVersion:
    """What one flashinfer release's A2A accepts, as far as sizing is concerned."""

    version: str
    max_top_k: int  # kMaxTopK: sizes the moe_a2a top-k regions and bounds top_k
    supports_eplb_stats: bool
    requires_divisible_experts: bool
    layout: str = LAYOUT_MOE_A2A
    max_ep_size: int = MAX_EP_SIZE
    # NVLinkOneSidedAlltoAll (0.7.4) specialises its kernels for these top-k values only.
    supported_top_k: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, version: str | None = None) -> "FlashInferVersion":
        return _parse_version((version or DEFAULT_FLASHINFER_VERSION).strip())

    @classmethod
    def _build(cls, version: str) -> "FlashInferVersion":
        if version not in SUPPORTED_FLASHINFER_VERSIONS:
            _release(version)  # a malformed string gets the format message
            raise SizingError(
                f"flashinfer {version} has no MoE A2A capwatch knows; supported: "
                f"{SUPPORTED_FLASHINFER_VERSIONS[0]} ... {LATEST_FLASHINFER_VERSION} "
                f"({', '.join(SUPPORTED_FLASHINFER_VERSIONS)})"
            )
        release = _release(version)
        nvlink_one_sided = release >= (0, 7, 4)
        return cls(
            version=version,
            max_top_k=8 if release < (0, 6, 8) else 22,
            supports_eplb_stats=release >= (0, 6, 16),
            # 0.6.16 allowed non-divisible expert counts; 0.7.4's moe_ep base class forbids them again.
            requires_divisible_experts=release < (0, 6, 16) or nvlink_one_sided,
            layout=LAYOUT_NVLINK_ONE_SIDED if nvlink_one_sided else LAYOUT_MOE_A2A,
            max_ep_size=256 if nvlink_one_sided else MAX_EP_SIZE,
            supported_top_k=(1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22) if nvlink_one_sided else None,
        )


def lacks_moe_alltoall(version: str) -> bool:
    """Whether flashinfer ``version`` (any release, known to capwatch or not) comes after ``MoeAlltoAll``'s
    removal; False for a version string that is not X.Y.Z[.postN]."""
    try:
        return _release(version) >= _release(MOE_ALLTOALL_REMOVED_IN)
    except SizingError:
        return False


@functools.lru_cache(maxsize=None)
def _parse_version(version: str) -> FlashInferVersion:
    # Cached: the advisor prices many caps per request, each parsing the same version string.
    return FlashInferVersion._build(version)



def check_ep_size(ep_size: int, version: FlashInferVersion) -> int:
    check_positive("ep_size", ep_size)
    if ep_size > version.max_ep_size:
        raise SizingError(
            f"ep_size {ep_size} exceeds flashinfer {version.version}'s limit of {version.max_ep_size} ranks"
        )
    return ep_size


def check_max_num_tokens(max_num_tokens: int, name: str = "max_num_tokens (the per-rank cap)") -> int:
    check_positive(name, max_num_tokens)
    if max_num_tokens > INT32_MAX:
        raise SizingError(f"{name} {max_num_tokens} does not fit FlashInfer's int32 token count")
    return max_num_tokens


def check_eplb_stats(eplb_stats_num_experts: int, version: FlashInferVersion) -> int:
    check_integer("eplb_stats_num_experts", eplb_stats_num_experts, 0)
    if eplb_stats_num_experts and not version.supports_eplb_stats:
        raise SizingError(
            f"flashinfer {version.version} has no EPLB stats region (added in 0.6.16); "
            "drop eplb_stats_num_experts or pick a newer version"
        )
    return eplb_stats_num_experts


def check_routing(top_k: int, num_experts: int, ep_size: int, version: FlashInferVersion,
                  eplb_stats_num_experts: int = 0) -> None:
    """The routing checks FlashInfer applies at construction or first dispatch."""
    check_positive("top_k", top_k)
    check_positive("num_experts", num_experts)
    if top_k > version.max_top_k:
        raise SizingError(f"top_k {top_k} exceeds flashinfer {version.version}'s kMaxTopK of {version.max_top_k}")
    if version.supported_top_k is not None and top_k not in version.supported_top_k:
        raise SizingError(
            f"flashinfer {version.version}'s NVLinkOneSidedAlltoAll supports top_k in "
            f"{', '.join(map(str, version.supported_top_k))}; got {top_k}"
        )
    if top_k > num_experts:
        raise SizingError(f"top_k {top_k} exceeds num_experts {num_experts}")
    if num_experts < ep_size:
        raise SizingError(f"num_experts {num_experts} must be >= ep_size {ep_size}: every rank needs an expert")
    if version.requires_divisible_experts and num_experts % ep_size:
        raise SizingError(
            f"flashinfer {version.version} requires num_experts ({num_experts}) divisible by ep_size ({ep_size})"
        )
    if num_experts > MAX_NUM_EXPERTS:
        raise SizingError(f"num_experts {num_experts} exceeds {MAX_NUM_EXPERTS}, more than any real MoE model")
    # The stats region holds one counter per expert: more stats experts than experts is a typo.
    if eplb_stats_num_experts > num_experts:
        raise SizingError(f"eplb_stats_num_experts {eplb_stats_num_experts} must be <= num_experts {num_experts}")


# FlashInfer's cap: any cap within capwatch's range (an engine's bug that sized its workspace for cap x ep_size is
# the engine's fact: SGLang's, sglang_engine/flashinfer.py).
FLASHINFER = BackendCapRules("flashinfer", sized_by="FlashInfer's formula",
                             mismatch_hint="check flashinfer_version and the payload sizes")

"""FlashInfer 0.7.4 as built: where CFT or the Lamport transport is on (the hardware decides, at run time), the
workspace bytes are the built ``NVLinkOneSidedAlltoAll``'s own figure (its metainfo), and that is what the rank
reports, exports and is priced at for its cap; any other cap is priced at 0.7.4's layout with the same regions."""

from __future__ import annotations

import pytest
from capwatch.backends import pricing_of, spec_of
from capwatch.backends.flashinfer import FlashInferParams
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.service.sources.prometheus.rank_config import rank_config_of
from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_one_sided import default_lamport_max_tokens, nvlink_one_sided_layout
from capwatch.telemetry import catalogue
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankConfig, RankIdentity
from pydantic import ValidationError

EP_SIZE, CAP = 8, 1024
GEOMETRY = dict(hidden_size=7168, top_k=8, num_experts=256)  # DeepSeek-V3
# What a B200 group (148 SMs) settles on for DeepSeek-V3 in BF16: its Lamport limit from the SM count.
LAMPORT = default_lamport_max_tokens(EP_SIZE, 148, 8, 7168, "bf16", CAP)


def layout_bytes(cap: int, cft: bool = False, lamport_max_tokens: int = 0) -> int:
    return nvlink_one_sided_layout(EP_SIZE, cap, 8, 7168, cft=cft,
                                   lamport_max_tokens=lamport_max_tokens).workspace_bytes_per_rank


def built_rank(built_bytes: int | None, cft: bool = True, lamport_max_tokens: int = LAMPORT, cap: int = CAP,
               **params):
    return rank_config(cap=cap, ep_size=EP_SIZE, backend="sglang-flashinfer", a2a_backend="flashinfer", **GEOMETRY,
                       flashinfer=FlashInferParams(flashinfer_version="0.7.4", cft=cft, lamport_max_tokens=lamport_max_tokens,
                                                   built_workspace_bytes=built_bytes, **params))


def test_the_built_figure_is_reported_exported_and_priced_at_its_cap():
    built = layout_bytes(CAP, cft=True, lamport_max_tokens=LAMPORT)
    assert 0 < LAMPORT < CAP and built > layout_bytes(CAP)  # what the offline (fence path) figure leaves out
    config = built_rank(built)
    assert config.workspace_bytes_per_rank == built

    identity = RankIdentity(cluster="c", ep_rank=0, ep_size=EP_SIZE, boot_id="b")
    collector = DispatchCollector(IntervalTracker(DispatchCounters(CAP, EP_SIZE)), identity, config)
    families = list(collector.collect())
    values = {sample.name: sample.value for family in families for sample in family.samples}
    labels = {sample.name: sample.labels for family in families for sample in family.samples}
    assert values[catalogue.WORKSPACE_BYTES.name] == built
    assert values["moe_a2a_flashinfer_built_workspace_bytes"] == built
    assert values["moe_a2a_flashinfer_cft"] == 1 and values["moe_a2a_flashinfer_lamport_max_tokens"] == LAMPORT
    assert rank_config_of(values, labels[catalogue.INFO.name], None) == config  # the Prometheus source reads it back

    pricing = pricing_of(config, EP_SIZE)
    assert pricing.bytes_per_rank(CAP) == built
    # Other caps: the layout with the same regions, the Lamport limit clamped to a smaller cap as FlashInfer does.
    assert pricing.bytes_per_rank(2 * CAP) == layout_bytes(2 * CAP, cft=True, lamport_max_tokens=LAMPORT)
    assert pricing.bytes_per_rank(128) == layout_bytes(128, cft=True, lamport_max_tokens=128)


def test_the_built_figure_wins_at_its_cap_even_where_the_layout_disagrees():
    # A figure capwatch's layout would not give (a FlashInfer build that sized differently): its cap is priced at
    # what the object allocated, not at capwatch's arithmetic; another cap at the layout.
    built = layout_bytes(CAP, cft=True, lamport_max_tokens=LAMPORT) + 4096
    pricing = pricing_of(built_rank(built), EP_SIZE)
    assert pricing.bytes_per_rank(CAP) == built
    assert pricing.bytes_per_rank(CAP + 128) == layout_bytes(CAP + 128, cft=True, lamport_max_tokens=LAMPORT)


def test_without_a_built_figure_the_regions_still_price():
    config = built_rank(None, cft=False, lamport_max_tokens=256)
    assert config.workspace_bytes_per_rank == layout_bytes(CAP, lamport_max_tokens=256)
    assert pricing_of(config, EP_SIZE).bytes_per_rank(CAP) == config.workspace_bytes_per_rank


@pytest.mark.parametrize("version", [None, "0.7.2.post1", "0.6.8"])
@pytest.mark.parametrize("field", [{"cft": True}, {"lamport_max_tokens": 128}, {"built_workspace_bytes": 1 << 30}])
def test_the_built_regions_belong_to_0_7_4_alone(version, field):
    with pytest.raises(ValidationError, match="flashinfer 0.7.4's NVLinkOneSidedAlltoAll"):
        FlashInferParams(flashinfer_version=version, **field)


def test_a_lamport_limit_the_built_object_could_not_have_is_refused():
    with pytest.raises((SizingError, ValidationError), match="clamps its Lamport limit to the cap"):
        built_rank(None, cap=128, lamport_max_tokens=256)
    with pytest.raises(SizingError, match="Lamport transport does not carry fp8"):
        built_rank(None, payload_format="fp8")
    with pytest.raises(ValidationError):
        FlashInferParams(flashinfer_version="0.7.4", lamport_max_tokens=513)  # kMaxTokensPerRank


def test_a_built_figure_below_the_layout_is_refused_on_the_rank_and_at_the_service():
    floor = layout_bytes(CAP, cft=True, lamport_max_tokens=LAMPORT)
    with pytest.raises(SizingError, match="is below"):
        built_rank(floor - 1)
    config = built_rank(floor).model_dump()
    config["flashinfer"]["built_workspace_bytes"] = floor - 1  # a body the service receives as is
    refusal = spec_of("flashinfer").group_refusal(RankConfig.model_validate(config), EP_SIZE)
    assert refusal is not None and "is below" in refusal


def test_the_price_is_exact_but_above_a_lamport_limit_the_cap_clamped_a_lower_bound():
    """The advice's basis (``price_basis``): 0.7.4 as built is exact at every cap, but where the built cap clamped
    the Lamport limit a larger cap's Lamport regions are priced at the built limit: a lower bound, said so."""
    from capwatch.backends.spec import price_basis
    from capwatch.sizing.flashinfer_one_sided import LAMPORT_MAX_TOKENS_PER_RANK

    pricing = pricing_of(built_rank(layout_bytes(CAP, cft=True, lamport_max_tokens=LAMPORT)), EP_SIZE)
    assert all(price_basis(pricing, cap).exact for cap in (128, CAP, 2 * CAP))  # the SM count set the limit
    clamped_cap = 128
    assert LAMPORT > clamped_cap
    clamped = pricing_of(built_rank(layout_bytes(clamped_cap, cft=True, lamport_max_tokens=clamped_cap),
                                    lamport_max_tokens=clamped_cap, cap=clamped_cap), EP_SIZE)
    assert price_basis(clamped, 64).exact and price_basis(clamped, clamped_cap).exact
    above = price_basis(clamped, 2 * clamped_cap)
    assert not above.exact and above.reported_cap == clamped_cap
    assert above.words.startswith(f"a lower bound: the Lamport regions priced at the {clamped_cap} tokens built at cap "
                                  f"{clamped_cap}") and str(LAMPORT_MAX_TOKENS_PER_RANK) in above.words
    unbuilt = pricing_of(built_rank(None, cft=False, lamport_max_tokens=0), EP_SIZE)  # sized offline: exact
    assert price_basis(unbuilt, 2 * CAP).exact

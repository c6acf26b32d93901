"""The report model accepts everything sizing and the dispatcher can produce, and nothing else."""

from __future__ import annotations

from typing import get_args

import pytest
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.sizing.flashinfer_releases import SUPPORTED_FLASHINFER_VERSIONS, FlashInferVersion
from capwatch.sizing.payloads import SIZING_PAYLOAD_FORMATS
from capwatch.telemetry.rank import rank_config
from capwatch.backends.flashinfer import PayloadFormat
from capwatch.telemetry.report import MAX_TOP_K, OverflowKind, OverflowOutcome, RankIdentity, Role
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, new_boot_id
from pydantic import ValidationError

from capwatch.vocabulary import OVERFLOW_KINDS, OVERFLOW_OUTCOMES, ROLES

from .sink import ReportSink


@pytest.fixture(scope="module")
def sink():
    sink = ReportSink().start()
    yield sink
    sink.stop()


@pytest.mark.parametrize("payload_format", SIZING_PAYLOAD_FORMATS)
def test_a_rank_with_any_payload_format_sizing_supports_can_report(sink, payload_format):
    counters = DispatchCounters(64, 2)
    identity = RankIdentity(cluster="formats", ep_rank=0, ep_size=2, boot_id=new_boot_id())
    config = rank_config(cap=64, ep_size=2, hidden_size=256, top_k=4, num_experts=8, backend="torch",
                         payload_format=payload_format)
    reporter = RankReporter(counters, identity, config, ReporterOptions(sink.url))
    counters.record_step(10)
    assert reporter.flush_final("done", timeout_s=10)
    (report,) = sink.by_boot()[identity.boot_id]
    assert report.config.flashinfer.payload_format == payload_format and sink.invalid == []


def test_an_unknown_payload_format_is_refused_with_the_choices():
    config = rank_config(cap=64, ep_size=2, hidden_size=256, top_k=4, num_experts=8, backend="torch")
    body = config.model_dump()
    with pytest.raises(ValidationError, match="deepseek-fp8"):
        config.model_validate({**body, "flashinfer": {"payload_format": "int3"}})
    legacy = {name: value for name, value in body.items() if name != "flashinfer"}  # a body of before the move
    with pytest.raises(ValidationError, match="deepseek-fp8"):
        config.model_validate({**legacy, "payload_format": "int3"})
    with pytest.raises(ValidationError, match="give them once"):  # both places: which one is meant is unclear
        config.model_validate({**body, "payload_format": "bf16"})


def test_the_literals_are_the_dispatcher_and_sizing_values():
    assert get_args(PayloadFormat) == SIZING_PAYLOAD_FORMATS
    assert get_args(Role) == ROLES
    assert get_args(OverflowKind) == OVERFLOW_KINDS
    assert get_args(OverflowOutcome) == OVERFLOW_OUTCOMES


def test_top_k_is_bounded_by_the_largest_kmaxtopk_sizing_knows():
    assert MAX_TOP_K == FlashInferVersion.parse(SUPPORTED_FLASHINFER_VERSIONS[-1]).max_top_k
    config = rank_config(cap=64, ep_size=2, hidden_size=256, top_k=4, num_experts=64, backend="torch")
    assert config.model_validate({**config.model_dump(), "top_k": MAX_TOP_K}).top_k == MAX_TOP_K
    with pytest.raises(ValidationError, match="less than or equal to 22"):
        config.model_validate({**config.model_dump(), "top_k": MAX_TOP_K + 1})


def _deepep_config(**changes):
    from capwatch.backends.deepep import DeepEPBuffer

    options = dict(cap=256, ep_size=8, hidden_size=7168, top_k=8, num_experts=256, backend="sglang-deepep",
                   a2a_backend="deepep", deepep=DeepEPBuffer(mode="low_latency", buffer_experts=256))
    return rank_config(**{**options, **changes})


def test_a_deepep_rank_reports_its_buffer_priced_as_sglang_allocates_it(sink):
    from capwatch.sglang_engine.deepep import plan_deepep_buffer
    from capwatch.sizing.model_presets import model_geometry

    config = _deepep_config()
    plan = plan_deepep_buffer(model_geometry("deepseek-v3"), 8, 256, "low_latency")
    assert config.workspace_bytes_per_rank == plan.buffer_bytes_per_rank
    assert (config.dispatch_bytes_per_token, config.combine_bytes_per_token) == (
        plan.dispatch_message_bytes, plan.combine_message_bytes)
    counters = DispatchCounters(256, 8)
    identity = RankIdentity(cluster="deepep", ep_rank=3, ep_size=8, boot_id=new_boot_id())
    reporter = RankReporter(counters, identity, config, ReporterOptions(sink.url))
    counters.record_step(100, 100)
    assert reporter.flush_final("done", timeout_s=10)
    (report,) = sink.by_boot()[identity.boot_id]
    assert report.config.a2a_backend == "deepep" and report.config.deepep.buffer_experts == 256
    assert sink.invalid == []


@pytest.mark.parametrize(("changes", "message"), [
    ({"cap": 2048}, "above 1024"),
    ({"hidden_size": 2880, "top_k": 4, "num_experts": 128}, "do not run hidden size 2880"),
    ({"payload_format": "fp8"}, "the flashinfer backend's parameters, not a deepep rank's"),
    ({"flashinfer_version": "0.7.2"}, "the flashinfer backend's parameters, not a deepep rank's"),
    ({"flashinfer": {"payload_format": "bf16"}}, "reports no flashinfer parameters"),
    ({"deepep": None}, "needs its deepep buffer"),
    ({"a2a_backend": "flashinfer"}, "reports no deepep parameters"),
])
def test_what_deepep_or_sglang_refuses_no_report_carries(changes, message):
    config = _deepep_config()
    with pytest.raises((ValidationError, ValueError), match=message):
        config.model_validate({**config.model_dump(), **changes})


def test_a_deepep_buffer_must_fit_its_mode_and_divide_among_the_group():
    from capwatch.backends.deepep import DeepEPBuffer
    from capwatch.telemetry.report import check_priceable  # RankReport runs it on every report

    with pytest.raises(ValidationError, match="no normal-mode bytes"):
        DeepEPBuffer(mode="low_latency", buffer_experts=256, normal_nvl_bytes=1)
    config = _deepep_config()
    check_priceable(config, 8)
    odd = config.model_validate({**config.model_dump(), "deepep": {"mode": "low_latency", "buffer_experts": 260}})
    with pytest.raises(ValueError, match="260 experts do not divide among 8 ranks"):
        check_priceable(odd, 8)


# A FlashInfer rank's config as the SGLang plugin sent it before engines were named on the wire (its JSON, verbatim).
TODAYS_CONFIG_JSON = (
    '{"cap":1024,"hidden_size":7168,"top_k":8,"num_experts":256,"payload_format":"bf16",'
    '"backend":"sglang-flashinfer","flashinfer_version":null,"overflow_policy":"raise","eplb_stats_num_experts":0,'
    '"dispatch_bytes_per_token":14400,"combine_bytes_per_token":14336,"workspace_bytes_per_rank":123456789,'
    '"allocated_workspace_bytes":null,"cuda_graph_max_batch_size":256,"speculative_tokens":0,'
    '"sglang":{"sglang_version":"0.5.23","disaggregation_mode":"null","max_prefill_buffer_tokens":8192,'
    '"prefill_cuda_graph_max_batch_size":0,"decode_cuda_graph_max_batch_size":256,"tokens_per_request":1,'
    '"cap_source":"env","floor_rule":"sglang"},"a2a_backend":"flashinfer"}')


def test_an_engines_limits_ride_under_its_name_and_say_which_engine_they_are():
    """Issue #30: engine-specific limits on the wire are discriminated by engine — RankConfig carries each
    registered engine's limits under its name, and the limits name their engine; today's JSON still reads, and
    what a rank sends stays today's JSON (a service of an older release refuses unknown keys)."""
    import json

    from capwatch.engines import ENGINES
    from capwatch.sglang_engine import limits
    from capwatch.telemetry import report
    from capwatch.telemetry.report import RankConfig, SGLangLimits  # the path of before the move, kept for users

    assert SGLangLimits is limits.SGLangLimits and report.__getattr__("SGLangLimits") is limits.SGLangLimits

    for name, engine in ENGINES.items():
        assert RankConfig.model_fields[name].annotation == engine.LIMITS | None
        assert engine.LIMITS.model_fields["engine"].default == name
    config = RankConfig.model_validate_json(TODAYS_CONFIG_JSON)
    assert config.sglang.engine == "sglang" and config.sglang.max_prefill_buffer_tokens == 8192
    sent = config.model_dump_json()  # the engine stays implied by the field: no key a service never saw
    assert "engine" not in json.loads(sent)["sglang"] and RankConfig.model_validate_json(sent) == config
    said = json.loads(TODAYS_CONFIG_JSON)
    said["sglang"]["engine"] = "sglang"
    assert RankConfig.model_validate(said).sglang == config.sglang
    said["sglang"]["engine"] = "vllm"
    with pytest.raises(ValidationError, match=r"sglang\.engine"):
        RankConfig.model_validate(said)
    assert SGLangLimits.model_validate({"engine": "sglang"}) == SGLangLimits()

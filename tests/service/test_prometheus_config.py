"""A rank's config survives the trip through its own exposition: what the Prometheus source rebuilds
from the rank's series (``rank_config_of``) is the ``RankConfig`` its reports carry, SGLang's floor inputs
and the model geometry included, for any config a rank can report. What it cannot rebuild whole is an
``UnpricedConfig`` that says what it does not know."""

from __future__ import annotations

import pytest
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.backends import SPECS, pricing_of
from capwatch.backends.flashinfer import WorkspacePricing
from capwatch.service.sources.contract import UnpricedConfig
from capwatch.service.sources.prometheus.rank_config import rank_config_of
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_low_latency import LOW_LATENCY_HIDDEN_SIZES
from capwatch.sglang_engine.deepep import DEEPEP_MODES, plan_deepep_buffer
from capwatch.sizing.model_presets import MODEL_PRESETS
from capwatch.telemetry import catalogue
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import RankExporter
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.rank import rank_config
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.sglang_engine.limits import MAX_ADVICE_REVISION
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.telemetry.report import MAX_CAP_TOKENS, RankConfig, RankIdentity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.telemetry.promtool import promtool_findings

EP_SIZE = 2
SGLANG_METRICS = catalogue.ENGINE_METRICS["sglang"]  # moe_a2a_sglang_info and the gauges of SGLang's floor terms
SGLANG_GAUGES = dict((field, spec) for spec, field in SGLANG_METRICS.gauges)
UNIFIED = SGLangLimits(sglang_version="0.5.23", max_prefill_buffer_tokens=2048,
                       decode_cuda_graph_max_batch_size=256, tokens_per_request=4)

@st.composite
def cap_origins(draw) -> dict:
    """Who set the cap (the legacy "env" reads as "operator") and, for capwatch, the advice revision."""
    source = draw(st.sampled_from(["env", "operator", "default", "capwatch"]))
    revision = draw(st.integers(0, MAX_ADVICE_REVISION)) if source == "capwatch" else None
    return dict(cap_source=source, advice_revision=revision)


sglang_limits = cap_origins().flatmap(lambda origin: st.builds(
    SGLangLimits,
    # Any text: quotes, backslashes and newlines are escaped in the exposition and must read back.
    sglang_version=st.none() | st.text(min_size=1, max_size=32),
    disaggregation_mode=st.sampled_from(["null", "prefill", "decode"]),
    max_prefill_buffer_tokens=st.integers(0, MAX_CAP_TOKENS),
    prefill_cuda_graph_max_batch_size=st.integers(0, MAX_CAP_TOKENS),
    decode_cuda_graph_max_batch_size=st.integers(0, MAX_CAP_TOKENS),
    tokens_per_request=st.integers(1, 1024),
    floor_rule=st.sampled_from(["sglang", "capwatch", "capwatch_prefill"]),
    **{name: st.just(value) for name, value in origin.items()},
))


@st.composite
def rank_configs(draw) -> RankConfig:
    geometry = draw(st.sampled_from(sorted(MODEL_PRESETS.values(), key=lambda preset: preset.name)))
    if geometry.hidden_size in LOW_LATENCY_HIDDEN_SIZES and draw(st.booleans()):
        return draw(deepep_rank_configs(geometry))
    return rank_config(
        cap=draw(st.integers(1, 1 << 16)), ep_size=EP_SIZE, hidden_size=geometry.hidden_size,
        top_k=geometry.top_k, num_experts=geometry.num_experts, backend=draw(st.sampled_from(["torch", "flashinfer"])),
        overflow_policy=draw(st.sampled_from(["raise", "chunk"])),
        eplb_stats_num_experts=draw(st.sampled_from([0, geometry.num_experts])),
        allocated_workspace_bytes=draw(st.none() | st.integers(1, 1 << 40)),
        cuda_graph_max_batch_size=draw(st.none() | st.integers(1, 4096)),
        speculative_tokens=draw(st.integers(0, 64)), sglang=draw(st.none() | sglang_limits))


@st.composite
def deepep_rank_configs(draw, geometry) -> RankConfig:
    """A DeepEP rank's config as the plugin reports it: its buffer sized by SGLang's rule."""
    plan = plan_deepep_buffer(geometry, EP_SIZE, draw(st.integers(1, 1024)), draw(st.sampled_from(DEEPEP_MODES)),
                              redundant_experts=EP_SIZE * draw(st.integers(0, 16)))
    return rank_config(
        cap=plan.cap, ep_size=EP_SIZE, hidden_size=geometry.hidden_size, top_k=geometry.top_k,
        num_experts=geometry.num_experts, backend="sglang-deepep", a2a_backend="deepep",
        deepep=DeepEPBuffer(mode=plan.deepep_mode, buffer_experts=plan.buffer_experts,
                            normal_nvl_bytes=plan.normal_nvl_bytes, normal_rdma_bytes=plan.normal_rdma_bytes),
        allocated_workspace_bytes=draw(st.none() | st.just(plan.buffer_bytes_per_rank)),
        cuda_graph_max_batch_size=draw(st.none() | st.integers(1, 4096)), sglang=draw(st.none() | sglang_limits))


def exposition(config: RankConfig) -> bytes:
    identity = RankIdentity(cluster="trip", ep_rank=1, ep_size=EP_SIZE, boot_id="b1")
    counters = DispatchCounters(config.cap, EP_SIZE)
    return RankExporter(DispatchCollector(IntervalTracker(counters), identity, config)).render()


def rebuilt(text: bytes) -> RankConfig | UnpricedConfig | None:
    """What the Prometheus source reads of one rank: values by series name, the info series' labels."""
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            values[sample.name] = sample.value
            labels[sample.name] = sample.labels
    return rank_config_of(values, labels[catalogue.INFO.name],
                          {name: labels.get(metrics.info.name) for name, metrics in catalogue.ENGINE_METRICS.items()},
                          {name: labels.get(metrics.info.name) for name, metrics in catalogue.BACKEND_METRICS.items()
                           if not metrics.on_shared_series})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rank_configs())
def test_the_exported_series_rebuild_exactly_the_reported_config(config):
    assert rebuilt(exposition(config)) == config


def test_sglang_series_lint_clean_and_carry_the_floor_inputs():
    config = rank_config(cap=4096, ep_size=EP_SIZE, hidden_size=2048, top_k=8, num_experts=128, backend="torch",
                         cuda_graph_max_batch_size=256, speculative_tokens=3, sglang=UNIFIED)
    text = exposition(config)
    assert promtool_findings(text) == []
    families = {family.name: family for family in text_string_to_metric_families(text.decode())}
    info = families[SGLANG_METRICS.info.name].samples
    assert len(info) == 1 and info[0].value == 1 and info[0].labels == {
        "ep_group": "trip", "ep_rank": "1", "dispatcher": "target", "sglang_version": "0.5.23",
        "disaggregation_mode": "null", "cap_source": "operator", "floor_rule": "sglang", "advice_revision": ""}
    assert families[SGLANG_GAUGES["max_prefill_buffer_tokens"].name].samples[0].value == 2048
    assert families[SGLANG_GAUGES["decode_cuda_graph_max_batch_size"].name].samples[0].value == 256
    assert families[catalogue.MODEL_EXPERTS.name].samples[0].value == 128


def test_without_sglang_the_sglang_series_are_absent_and_the_config_says_none():
    config = rank_config(cap=128, ep_size=EP_SIZE, hidden_size=64, top_k=4, num_experts=8, backend="torch")
    text = exposition(config)
    families = {family.name: family for family in text_string_to_metric_families(text.decode())}
    assert families[SGLANG_METRICS.info.name].samples == []
    assert all(families[spec.name].samples == [] for spec, _ in SGLANG_METRICS.gauges)
    assert families[catalogue.CUDA_GRAPH_MAX_BATCH_SIZE.name].samples == []  # not reported: absent, not 0
    assert rebuilt(text) == config and rebuilt(text).sglang is None


def test_labels_an_older_exporter_lacks_read_as_the_reports_defaults():
    """An exporter older than the payload-format, overflow-policy, backend, cap-source and floor-rule labels (and
    the speculative-tokens gauge): the rank reads as the RankConfig it would have reported, its defaults filled."""
    config = rank_config(cap=4096, ep_size=EP_SIZE, hidden_size=2048, top_k=8, num_experts=128, backend="torch",
                         sglang=SGLangLimits(max_prefill_buffer_tokens=2048, decode_cuda_graph_max_batch_size=256))
    older = {"payload_format", "overflow_policy", "a2a_backend", "cap_source", "floor_rule", "disaggregation_mode",
             "advice_revision"}
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(exposition(config).decode()):
        for sample in family.samples:
            if sample.name != catalogue.SPECULATIVE_TOKENS.name:
                values[sample.name] = sample.value
            labels[sample.name] = {name: value for name, value in sample.labels.items() if name not in older}
    read = rank_config_of(values, labels[catalogue.INFO.name], {"sglang": labels[SGLANG_METRICS.info.name]})
    assert isinstance(read, RankConfig) and read == config
    assert (read.flashinfer.payload_format, read.overflow_policy, read.a2a_backend, read.speculative_tokens) == (
        "bf16", "raise", "flashinfer", 0)
    limits = read.sglang
    assert (limits.cap_source, limits.floor_rule, limits.disaggregation_mode) == ("operator", "sglang", "null")
    assert limits.advice_revision is None


def test_an_exporter_without_the_geometry_gauges_is_priced_by_its_bytes_per_token_alone():
    """An exporter older than the geometry gauges: the config keeps no geometry (as before), not a guess."""
    config = rank_config(cap=128, ep_size=EP_SIZE, hidden_size=64, top_k=4, num_experts=8, backend="torch")
    kept = "\n".join(line for line in exposition(config).decode().splitlines()
                     if "moe_a2a_model_" not in line).encode()
    rebuilt_config = rebuilt(kept)
    assert isinstance(rebuilt_config, UnpricedConfig)
    assert (rebuilt_config.hidden_size, rebuilt_config.top_k, rebuilt_config.num_experts) == (None, None, None)
    assert rebuilt_config.workspace_bytes_per_rank == config.workspace_bytes_per_rank
    assert rebuilt_config.dispatch_bytes_per_token == config.dispatch_bytes_per_token
    pricing = WorkspacePricing.of_config(rebuilt_config, EP_SIZE)
    assert pricing.geometry is None and pricing.bytes_per_rank(config.cap) == config.workspace_bytes_per_rank


def test_series_no_rank_could_report_together_fall_back_to_the_unpriced_config():
    """Geometry FlashInfer would refuse (top-k above the experts): no crash, no geometry kept."""
    values = {spec.name: 1.0 for spec, _ in catalogue.RANK_CONFIG_GAUGES}
    values |= {catalogue.MODEL_TOP_K.name: 9.0, catalogue.MODEL_EXPERTS.name: 4.0,
               catalogue.CUDA_GRAPH_MAX_BATCH_SIZE.name: float("inf")}
    config = rank_config_of(values, {"backend": "torch"}, {"sglang": {"disaggregation_mode": "decode"}})
    assert isinstance(config, UnpricedConfig) and config.hidden_size is None and config.sglang is None
    assert config.cuda_graph_max_batch_size is None  # +Inf is not a batch size


def test_without_the_bytes_per_token_the_config_says_unknown_and_nothing_is_priced():
    """Series without the payload sizes: unknown (None), not a made-up byte per token."""
    config = rank_config_of({catalogue.CAP_TOKENS.name: 512.0}, {}, None)
    assert isinstance(config, UnpricedConfig) and config.cap == 512
    assert config.dispatch_bytes_per_token is None and config.workspace_bytes_per_rank is None
    with pytest.raises(SizingError, match="not known"):
        WorkspacePricing.of_config(config, EP_SIZE).bytes_per_rank(512)


@pytest.mark.parametrize("cap", [None, 0.0, -4.0, float("nan"), float("inf")])
def test_series_without_a_usable_cap_describe_no_rank(cap):
    values = {} if cap is None else {catalogue.CAP_TOKENS.name: cap}
    assert rank_config_of(values | {catalogue.DISPATCH_TOKEN_BYTES.name: 64.0}, {}, None) is None


DEEPEP_METRICS = catalogue.BACKEND_METRICS["deepep"]
_names = [spec.name for spec, _ in (*catalogue.RANK_CONFIG_GAUGES, *SGLANG_METRICS.gauges,
                                    *(gauge for metrics in catalogue.BACKEND_METRICS.values() for gauge in metrics.gauges))]
_labels = st.dictionaries(st.sampled_from([*catalogue.INFO_CONFIG_LABELS, *SGLANG_METRICS.info_labels,
                                           *DEEPEP_METRICS.info_labels, "ep_size"]),
                          st.sampled_from(["deepep", "flashinfer", "auto", "low_latency"]) | st.text(max_size=40),
                          max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(_names), st.floats(allow_nan=True, allow_infinity=True) | st.integers(-1, 1 << 60),
                       max_size=len(_names)), _labels, st.none() | _labels, st.none() | _labels)
def test_any_answer_from_prometheus_rebuilds_a_config_or_an_unpriced_one_never_an_error(values, info, sglang_info,
                                                                                       deepep_info):
    """Whatever a Prometheus holds under these names (a hand-written exporter, NaN, +Inf, negatives):
    no rank without a usable cap; else a config that validates, or one without geometry whose sizes are
    sizes a rank could have or unknown, and that prices or says why not (SizingError) — never a crash."""
    config = rank_config_of({name: float(value) for name, value in values.items()}, info, {"sglang": sglang_info},
                            {"deepep": deepep_info})
    cap = values.get(catalogue.CAP_TOKENS.name)
    if cap is None or not 1 <= float(cap) < float("inf"):
        assert config is None
        return
    if isinstance(config, RankConfig):
        assert RankConfig.model_validate(config.model_dump(), strict=False) == config
        return
    assert config.hidden_size is None and config.top_k is None and config.num_experts is None
    for size in (config.dispatch_bytes_per_token, config.combine_bytes_per_token, config.workspace_bytes_per_rank,
                 config.allocated_workspace_bytes, config.cuda_graph_max_batch_size):
        assert size is None or size >= 1
    assert config.speculative_tokens >= 0
    # A backend's parameters: what a rank could have reported (validated), or not known.
    assert all(spec.params_of(config) is None or isinstance(spec.params_of(config), spec.params)
               for spec in SPECS.values())
    try:
        pricing_of(config, EP_SIZE).bytes_per_rank(config.cap)
    except SizingError:
        pass


def test_a_deepep_ranks_series_name_its_backend_variable_and_buffer_and_rebuild_its_config():
    geometry = MODEL_PRESETS["deepseek-v3"]
    plan = plan_deepep_buffer(geometry, EP_SIZE, 256, "auto")
    config = rank_config(cap=256, ep_size=EP_SIZE, hidden_size=7168, top_k=8, num_experts=256,
                         backend="sglang-deepep", a2a_backend="deepep",
                         deepep=DeepEPBuffer(mode="auto", buffer_experts=256, normal_nvl_bytes=plan.normal_nvl_bytes,
                                             normal_rdma_bytes=plan.normal_rdma_bytes))
    text = exposition(config)
    assert promtool_findings(text) == []
    families = {family.name: family for family in text_string_to_metric_families(text.decode())}
    info = families[catalogue.INFO.name].samples[0].labels
    assert (info["a2a_backend"], info["cap_variable"]) == ("deepep", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK")
    assert families[DEEPEP_METRICS.info.name].samples[0].labels["mode"] == "auto"
    assert families[catalogue.WORKSPACE_BYTES.name].samples[0].value == plan.buffer_bytes_per_rank
    assert families["moe_a2a_deepep_normal_nvl_bytes"].samples[0].value == plan.normal_nvl_bytes
    assert rebuilt(text) == config
    assert pricing_of(rebuilt(text), EP_SIZE).bytes_per_rank(1024) == plan_deepep_buffer(
        geometry, EP_SIZE, 1024, "auto").buffer_bytes_per_rank
    flashinfer = exposition(rank_config(cap=128, ep_size=EP_SIZE, hidden_size=64, top_k=4, num_experts=8,
                                        backend="torch"))
    families = {family.name: family for family in text_string_to_metric_families(flashinfer.decode())}
    assert families[catalogue.INFO.name].samples[0].labels["cap_variable"] == \
        "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
    assert families[DEEPEP_METRICS.info.name].samples == []
    assert all(families[spec.name].samples == [] for spec, _ in DEEPEP_METRICS.gauges)


def test_a_cap_capwatch_applied_carries_its_revision_through_the_series():
    """Issue #32 item 4: the SGLang info says who set the cap and the advice revision; a Prometheus source reads
    both back (a revision 0 included: an empty label would be read as none)."""
    for revision in (0, 7):
        limits = UNIFIED.model_copy(update={"cap_source": "capwatch", "advice_revision": revision})
        config = rank_config(cap=4096, ep_size=EP_SIZE, hidden_size=2048, top_k=8, num_experts=128,
                             backend="torch", sglang=limits)
        text = exposition(config)
        assert promtool_findings(text) == []
        families = {family.name: family for family in text_string_to_metric_families(text.decode())}
        labels = families[SGLANG_METRICS.info.name].samples[0].labels
        assert (labels["cap_source"], labels["advice_revision"]) == ("capwatch", str(revision))
        assert rebuilt(text).sglang == limits


def test_an_older_exporters_env_source_reads_as_the_operator():
    """Ranks older than capwatch's apply said "env" for a variable the operator set: still accepted, as the
    operator, in reports and in series."""
    assert SGLangLimits.model_validate_json('{"cap_source": "env"}').cap_source == "operator"
    config = rank_config(cap=4096, ep_size=EP_SIZE, hidden_size=2048, top_k=8, num_experts=128, backend="torch",
                         sglang=UNIFIED)
    text = exposition(config).decode().replace('cap_source="operator"', 'cap_source="env"').replace(
        ',advice_revision=""', '').replace('advice_revision="",', '')
    assert 'cap_source="env"' in text and "advice_revision" not in text.split("moe_a2a_sglang_info{")[1].split("}")[0]
    assert rebuilt(text.encode()).sglang.cap_source == "operator"


def test_a_revision_without_capwatch_is_refused():
    with pytest.raises(ValueError, match="only a cap capwatch applied has an advice revision"):
        SGLangLimits(cap_source="operator", advice_revision=3)

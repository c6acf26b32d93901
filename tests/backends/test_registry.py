"""Every registered backend spec is complete: its rules, its parameters on the wire, its pricing, its series.

One parametrized test per backend over ``capwatch.backends.SPECS``: a new backend's spec is checked the moment
it is registered (and needs an example rank below, which the test asks for by name)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ValidationError

from capwatch.backends import BACKEND_NAMES, SPECS, pricing_of, spec_of
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.backends.mori import MoriOp
from capwatch.backends.pplx import PplxAllToAll
from capwatch.backends.reported import ReportedBuffer
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.service.sources.prometheus.rank_config import rank_config_of
from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import custom_geometry
from capwatch.telemetry import catalogue
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankConfig, RankIdentity, RankReport

EP_SIZE = 8
# One rank a real deployment of each backend reports (the rank_config keywords beyond cap and ep_size).
EXAMPLES: dict[str, dict] = {
    "flashinfer": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-flashinfer",
                       flashinfer_version="0.6.8"),
    "deepep": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-deepep",
                   deepep=DeepEPBuffer(mode="low_latency", buffer_experts=256)),
    "deepep_v2": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-deepep_v2",
                      deepep_v2=ReportedBuffer(buffer_bytes=3 << 30, dispatch_format="fp8")),
    "mooncake": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-mooncake",
                     mooncake=ReportedBuffer(buffer_bytes=1 << 30, dispatch_format="fp8")),
    "mori": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-mori",
                 mori=MoriOp(kernel="IntraNode", experts_per_rank=32)),
    "nixl": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-nixl",
                 nixl=ReportedBuffer(buffer_bytes=1 << 30, dispatch_format="fp8")),
    "pplx": dict(hidden_size=2048, top_k=8, num_experts=128, backend="sglang-pplx",  # Qwen3-30B-A3B: its max cap fits the wire
                 pplx=PplxAllToAll(transport="intranode", dp_size=1)),
    "flashinfer_megamoe": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-flashinfer_megamoe",
                               flashinfer_megamoe=ReportedBuffer(buffer_bytes=5 << 30)),
    "megamoe": dict(hidden_size=7168, top_k=8, num_experts=256, backend="sglang-megamoe",
                    megamoe=ReportedBuffer(buffer_bytes=5 << 30, dispatch_format="fp8")),
}
# What each example rank's server logged beyond the model (the log reader's view of it; absent: the defaults).
EXAMPLE_SETTINGS: dict[str, dict] = {"deepep": {"deepep_mode": "low_latency"},
                                     "pplx": {"tp_size": 8, "attn_dp_size": 8}}


def example(name: str, cap: int = 256) -> RankConfig:
    assert name in EXAMPLES, f"add an example rank of the {name!r} backend to EXAMPLES"
    return rank_config(cap=cap, ep_size=EP_SIZE, a2a_backend=name, **EXAMPLES[name])


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_the_rules_bound_a_cap_the_way_the_backend_does(name):
    spec = spec_of(name)
    rules = spec.rules
    assert spec.name == rules.name == name and rules.cap_env_var
    assert 1 <= rules.required_alignment <= rules.max_cap_tokens <= MAX_CAP_TOKENS
    assert rules.alignment % rules.required_alignment == 0 or CAP_ALIGNMENT % rules.required_alignment == 0
    assert (rules.required_alignment == 1) == (not rules.why_aligned), "an alignment the backend requires says why"
    assert (rules.max_cap_tokens == MAX_CAP_TOKENS) == (not rules.why_max), "a hard limit below capwatch's says why"
    rules.check_cap(rules.max_cap_tokens)
    for cap in (0, rules.max_cap_tokens + 1):
        with pytest.raises(SizingError):
            rules.check_cap(cap)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_its_parameters_ride_the_wire_under_its_name_and_nowhere_else(name):
    spec = spec_of(name)
    config = example(name)
    assert config.a2a_backend == name and spec.refusal(config) is None and spec.group_refusal(config, EP_SIZE) is None
    if spec.params is None:
        assert name not in RankConfig.model_fields
        return
    assert issubclass(spec.params, BaseModel) and spec.params.model_config.get("frozen")
    assert isinstance(spec.params_of(config), spec.params)
    assert RankConfig.model_validate(config.model_dump()) == config  # a JSON body of it validates back
    for other in set(BACKEND_NAMES) - {name}:  # another backend's rank may not carry them
        with pytest.raises(ValidationError, match=f"reports no {name} parameters"):
            RankConfig.model_validate({**example(other).model_dump(), name: spec.params_of(config).model_dump()})
    if spec.params_formerly_top_level:  # the wire's first backend: a rank that sends none runs the defaults
        assert RankConfig.model_validate({**config.model_dump(), name: None}).model_dump()[name] == \
            spec.params().model_dump()
        return
    with pytest.raises(ValidationError):  # and this backend's rank needs them
        RankConfig.model_validate({**config.model_dump(), name: None})


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_its_pricing_prices_what_its_ranks_report_at_every_cap(name):
    spec = spec_of(name)
    assert spec.bytes_known in ("exact", "reported")
    if spec.bytes_known == "reported":  # the bytes its rank reported at its cap, and an estimate elsewhere
        config = example(name)
        pricing = pricing_of(config, EP_SIZE)
        assert pricing.bytes_per_rank(config.cap) == pricing.known_bytes_per_rank(config.cap) \
            == config.workspace_bytes_per_rank == spec.params_of(config).buffer_bytes
        assert pricing.known_bytes_per_rank(2 * config.cap) is None
        assert pricing.bytes_per_rank(2 * config.cap) == 2 * config.workspace_bytes_per_rank
        assert isinstance(spec.prefill_dispatched(spec.params_of(config)), bool)
        return
    for cap in (spec.rules.required_alignment, 256, spec.rules.max_cap_tokens):
        config = example(name, cap)
        pricing = pricing_of(config, EP_SIZE)
        assert pricing.ep_size == EP_SIZE
        assert pricing.bytes_per_rank(cap) == pricing.known_bytes_per_rank(cap) == config.workspace_bytes_per_rank
        assert pricing_of(example(name), EP_SIZE).bytes_per_rank(cap) == config.workspace_bytes_per_rank
    assert isinstance(spec.prefill_dispatched(spec.params_of(example(name))), bool)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_its_series_are_exported_and_read_back_by_the_prometheus_source(name):
    spec = spec_of(name)
    config = example(name)
    identity = RankIdentity(cluster="c", ep_rank=0, ep_size=EP_SIZE, boot_id="b")
    own_counts = {counter.field: 3 + index for index, counter in
                  enumerate(spec.series.counters if spec.series is not None else ())}
    collector = DispatchCollector(IntervalTracker(DispatchCounters(config.cap, EP_SIZE)), identity, config,
                                  backend_counts=lambda: own_counts)
    families = {family.name: family for family in collector.collect()}
    assert (spec.series is None) == (name not in catalogue.BACKEND_METRICS) == (spec.params is None)
    for other, metrics in catalogue.BACKEND_METRICS.items():
        assert all(metric in catalogue.METRICS for metric in metrics.metrics)
        for counter, field in metrics.counters:  # its own counts: on its ranks alone, as the hook counted them
            assert counter.name == f"{catalogue.PREFIX}{other}_{field}_total" and counter.type == "counter"
            samples = families[counter.name.removesuffix("_total")].samples
            assert [sample.value for sample in samples] == ([own_counts[field]] if other == name else [])
        if metrics.on_shared_series:  # its labels on moe_a2a_info, its gauges on every rank (defaults elsewhere)
            assert set(metrics.info_labels) <= set(catalogue.INFO.labels)
            if other != name:
                params = spec_of(other).params()
                info = families[catalogue.INFO.name.removesuffix("_info")].samples[0].labels
                assert all(info[label] == str(getattr(params, label) or "none") for label in metrics.info_labels)
            continue
        assert metrics.info.name == f"{catalogue.PREFIX}{other}_info"
        if other != name:
            assert families[metrics.info.name.removesuffix("_info")].samples == []
    if spec.series is None:
        return
    metrics = catalogue.BACKEND_METRICS[name]
    assert set(metrics.info_labels) | {field for _, field in metrics.gauges} == set(spec.params.model_fields)
    values = {sample.name: sample.value for family in families.values() for sample in family.samples}
    labels = {sample.name: sample.labels for family in families.values() for sample in family.samples}
    rebuilt = rank_config_of(values, labels[catalogue.INFO.name], None,
                             {other: labels.get(metrics.info.name) for other, metrics in
                              catalogue.BACKEND_METRICS.items() if not metrics.on_shared_series})
    assert rebuilt == config


def test_an_unknown_backend_is_named_with_the_known_ones():
    with pytest.raises(SizingError, match=", ".join(sorted(SPECS))):
        spec_of("ascend_fuseep")
    with pytest.raises(ValidationError, match="a2a_backend"):
        RankConfig.model_validate({**example("flashinfer").model_dump(), "a2a_backend": "ascend_fuseep"})


def test_a_report_body_of_an_already_deployed_rank_still_validates():
    """The wire format of ranks running the release before the registry: the same JSON, field for field."""
    body = {
        "schema_version": 1,
        "identity": {"cluster": "prod", "ep_rank": 0, "ep_size": 8, "role": "target", "boot_id": "b0"},
        "sequence": 0, "sent_unix_s": 10.0,
        "config": {"cap": 256, "hidden_size": 7168, "top_k": 8, "num_experts": 256, "payload_format": "bf16",
                   "backend": "sglang-deepep", "flashinfer_version": None, "overflow_policy": "raise",
                   "eplb_stats_num_experts": 0, "dispatch_bytes_per_token": 7328, "combine_bytes_per_token": 14336,
                   "workspace_bytes_per_rank": example("deepep").workspace_bytes_per_rank,
                   "allocated_workspace_bytes": None, "cuda_graph_max_batch_size": 64, "speculative_tokens": 0,
                   "sglang": None, "a2a_backend": "deepep",
                   "deepep": {"mode": "low_latency", "buffer_experts": 256, "normal_nvl_bytes": 0,
                              "normal_rdma_bytes": 0}},
        "counters": {"dispatch_calls": 0, "forward_steps": 0, "tokens_sent": 0, "tokens_received": 0,
                     "max_runtime_tokens": 0},
        "interval": {"start_unix_s": 0.0, "end_unix_s": 10.0, "forward_steps": 0, "dispatch_calls": 0,
                     "peak_runtime_tokens": 0},
    }
    report = RankReport.model_validate(body)
    assert report.config.deepep == DeepEPBuffer(mode="low_latency", buffer_experts=256)
    flashinfer = {**body, "config": {**example("flashinfer").model_dump()}}
    flashinfer["config"].pop("deepep")  # a rank of the release before never sent the field
    assert RankReport.model_validate(flashinfer).config.a2a_backend == "flashinfer"


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_capwatch_plan_prices_it_through_its_planner(name):
    """Its planner: options no other backend claims, a plan per cap whose bytes are its pricing's, the largest cap
    within a budget, a table of one row per plan."""
    spec = spec_of(name)
    planner = spec.planner
    assert planner is not None and planner.description and planner.bytes_field
    others = {option.dest for other in SPECS.values() if other is not spec for option in other.planner.options}
    assert not others & {option.dest for option in planner.options}
    config = example(name)
    geometry = custom_geometry(config.hidden_size, config.top_k, config.num_experts)
    given = {option.dest: None for option in planner.options}
    if spec.bytes_known == "reported":  # nothing to plan from without the bytes a rank reported
        with pytest.raises(SizingError, match="cannot size"):
            planner.prepare(given, geometry, EP_SIZE, lambda flag, text, minimum=1: int(text))
        given = {f"{name}_buffer_bytes": str(config.workspace_bytes_per_rank), f"{name}_buffer_cap": str(config.cap)}
    options = planner.prepare(given, geometry, EP_SIZE, lambda flag, text, minimum=1: int(text))
    plan = planner.plan_at(cap=256, **options)
    assert plan.cap == 256 and getattr(plan, planner.bytes_field) >= pricing_of(config, EP_SIZE).bytes_per_rank(256) > 0
    budget = getattr(plan, planner.bytes_field)
    assert planner.largest_within(budget, **options, alignment=spec.rules.alignment).cap == 256
    table = planner.table([plan, planner.plan_at(cap=512, **options)], geometry, budget, None)
    assert len(table.rows) == 2 and all(len(row) == len(table.headers) for row in table.rows)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_the_log_reader_prices_it_from_the_engines_settings(name):
    """What a server's logged args say of it (no report to price from): its pricing agrees with its ranks'."""
    spec = spec_of(name)
    assert spec.settings_pricing is not None, f"the {name!r} spec says nothing of how to read it from settings"
    config = example(name)
    geometry = custom_geometry(config.hidden_size, config.top_k, config.num_experts)
    params = dict(spec.settings_params(_Settings(EXAMPLE_SETTINGS.get(name, {}))))
    if spec.bytes_known == "reported":  # a log has no bytes of the buffer: refused in words, never guessed
        with pytest.raises(SizingError, match="a server's log has no size"):
            spec.settings_pricing(params, geometry, EP_SIZE, spec.rules.alignment)
        return
    pricing, prefill = spec.settings_pricing(params, geometry, EP_SIZE, spec.rules.alignment)
    assert pricing.bytes_per_rank(256) == pricing_of(config, EP_SIZE).bytes_per_rank(256)
    assert prefill is spec.prefill_dispatched(spec.params_of(config))


class _Settings:
    """Logged args as the log reader reads them: absent ones at their defaults."""

    def __init__(self, args: dict):
        self.args = args

    def text(self, key: str) -> str | None:
        return self.args.get(key)

    def size(self, key: str, default: int, least: int) -> int:
        return self.args.get(key, default)

    def flag(self, key: str) -> bool:
        return bool(self.args.get(key))

"""The catalogue follows Prometheus' naming rules, and the docs show exactly the catalogue."""


import pytest
from capwatch.telemetry import catalogue

from tests.support.checkout import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "telemetry.md"


def test_docs_list_exactly_the_catalogue():
    assert catalogue.markdown_table() in DOCS.read_text()


@pytest.mark.parametrize("spec", catalogue.METRICS, ids=lambda spec: spec.name)
def test_names_follow_prometheus_conventions(spec):
    assert spec.name.startswith(catalogue.PREFIX) and spec.name == spec.name.lower()
    assert spec.name.endswith("_total") == (spec.type == "counter")
    assert spec.name.endswith("_info") == (spec.type == "info")
    assert spec.name.endswith("_ratio") == (spec.unit == "ratio")
    assert not any(unit in spec.name.split("_") for unit in ("ms", "seconds_ms", "kb", "mb", "gb", "percent"))
    assert set(catalogue.RANK_LABELS) <= set(spec.labels)
    assert not {"expert", "layer", "expert_id", "layer_id", "pid"} & set(spec.labels)
    assert spec.help.endswith(".") and len(spec.help) > 20


def test_names_are_unique():
    names = [spec.name for spec in catalogue.METRICS]
    assert len(names) == len(set(names))


def test_runtime_buckets_are_fixed_and_cover_every_cap():
    """The same bounds whatever the cap (ranks and restarts with different caps aggregate), each 1.33 - 1.5 x
    the one below, up to the largest cap accepted."""
    from capwatch.sizing.caps import MAX_CAP_TOKENS

    buckets = catalogue.RUNTIME_TOKEN_BUCKETS
    assert list(buckets) == sorted(set(buckets)) and all(bound == int(bound) for bound in buckets)
    assert buckets[-1] == MAX_CAP_TOKENS and buckets[0] == 16
    assert all(4 / 3 <= high / low <= 1.5 for low, high in zip(buckets, buckets[1:]))
    assert not hasattr(catalogue, "runtime_token_buckets")  # nothing fits them to a cap any more




@pytest.mark.parametrize("name", sorted(catalogue.ENGINE_METRICS))
def test_an_engines_series_are_its_limits_under_its_name(name):
    """Each registered engine's own series (its ``SERIES``) carry every field of its limits, once, under
    ``moe_a2a_<engine>_``: the shared catalogue names no engine, and a field added to the limits without a series
    (so lost on the way through Prometheus) fails here."""
    from capwatch.engines import ENGINES

    metrics = catalogue.ENGINE_METRICS[name]
    assert metrics.info is not None and metrics.info.name == f"{catalogue.PREFIX}{name}_info"
    assert metrics.info.labels == catalogue.RANK_LABELS + metrics.info_labels
    assert all(spec.name.startswith(f"{catalogue.PREFIX}{name}_") and spec.type == "gauge" for spec, _ in metrics.gauges)
    fields = [*metrics.info_labels, *(field for _, field in metrics.gauges)]
    assert len(fields) == len(set(fields))
    assert set(fields) == set(ENGINES[name].LIMITS.model_fields) - {"engine"}  # the discriminator is not on the wire
    assert set(metrics.metrics) <= set(catalogue.METRICS)


def test_the_traffic_help_says_for_every_hooked_backend_what_it_counts_and_on_which_layers():
    """Every backend the SGLang plugin hooks counts its traffic on a sample of layers: its spec says which (the help
    would say "every layer" for it otherwise), and both traffic series' help name it."""
    import re

    from capwatch.backends import SPECS
    from capwatch.sglang_plugin.hooks import BACKENDS

    for name in BACKENDS:
        assert SPECS[name].traffic_sample is not None, f"{name}: say on which layers its hook counts traffic"
        for spec in (catalogue.TOKENS_SENT, catalogue.TOKENS_RECEIVED):
            grouped = re.findall(r"\(([a-z0-9_, ]+)\)", spec.help)  # "what (backend, backend)"
            assert any(name in group.split(", ") for group in grouped), (name, spec.name)

"""The pieces of issue #32 items 4 and 5 the scheduler runs at start, without SGLang: who set the cap
(``cap_origin``: the launcher's record checked against the variable the dispatcher reads) and the start-up check
SGLang lacks (``start_check``: its line and its metric, promtool-clean). The whole path: test_cap_report.py."""

from __future__ import annotations

import logging

import pytest
from capwatch.sglang_plugin.apply.applied import record_applied
from capwatch.sglang_plugin.cap_origin import cap_origin
from capwatch.sglang_plugin.start_check import CAP_SHORTFALL, check_cap_at_start
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER
from capwatch.sglang_engine.limits import SGLangLimits
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.telemetry.promtool import promtool_findings

VARIABLE = DEEPEP.cap_env_var


def _environ(value: str | None, applied: tuple | None) -> dict:
    environ = {} if value is None else {VARIABLE: value}
    if applied is not None:
        record_applied(VARIABLE, *applied, "advice for this deployment", environ=environ)
    return environ


@pytest.mark.parametrize("value, applied, origin", [
    ("256", (256, "capwatch", 7), ("capwatch", 7)),
    ("256", (256, "capwatch", 0), ("capwatch", 0)),
    ("256", (256, "operator", None), ("operator", None)),
    ("256", None, ("operator", None)),  # no launcher record: capwatch applied nothing
    (None, None, ("default", None)),
    (None, (None, "default", None), ("default", None)),
])
def test_who_set_the_cap(value, applied, origin):
    assert cap_origin(VARIABLE, _environ(value, applied)) == origin


@pytest.mark.parametrize("value", ["512", None, "x"])
def test_a_variable_changed_after_capwatch_applied_it_is_not_reported_as_capwatchs(value, caplog):
    """What the dispatcher is built with is what the scheduler reports: capwatch's record alone is not enough."""
    with caplog.at_level(logging.WARNING, logger="capwatch.sglang"):
        source, revision = cap_origin(VARIABLE, _environ(value, (256, "capwatch", 7)))
    assert (source, revision) == ("default" if value is None else "operator", None)
    assert "not the 256 capwatch applied at start (revision 7)" in caplog.text


def _shortfall(collector) -> float:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry)
    assert promtool_findings(text) == []
    [family] = [family for family in text_string_to_metric_families(text.decode()) if family.name == CAP_SHORTFALL]
    [sample] = family.samples
    assert sample.labels == {"cap_variable": VARIABLE}
    return sample.value


DECODE = SGLangLimits(decode_cuda_graph_max_batch_size=96, tokens_per_request=2, floor_rule="capwatch")


def test_a_deepep_cap_below_the_decode_graph_batch_is_one_line_and_the_metric(caplog):
    with caplog.at_level(logging.INFO, logger="capwatch.sglang"):
        collector = check_cap_at_start(128, DECODE, DEEPEP)
    assert _shortfall(collector) == 192 - 128
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        f"capwatch: at start: {VARIABLE}=128: cap 128 is below the verify CUDA-graph batch 96 x 2 tokens per request "
        f"= 192 tokens, which SGLang does not check at start: {DEEPEP.below_floor}; set {VARIABLE}=256 or more, or "
        "lower the CUDA-graph batch (--cuda-graph-max-bs-decode)")


@pytest.mark.parametrize("cap, limits", [
    (192, DECODE),  # at the term: fits
    (128, DECODE.model_copy(update={"disaggregation_mode": "prefill"})),  # a prefill server captures no decode graph
    (128, SGLangLimits(decode_cuda_graph_max_batch_size=0)),  # no decode graphs
])
def test_a_cap_that_fits_is_silent_and_reads_zero(cap, limits, caplog):
    with caplog.at_level(logging.INFO, logger="capwatch.sglang"):
        assert _shortfall(check_cap_at_start(cap, limits, DEEPEP)) == 0
    assert caplog.records == []


def test_a_term_past_deepeps_largest_cap_asks_for_a_smaller_graph_batch(caplog):
    with caplog.at_level(logging.ERROR, logger="capwatch.sglang"):
        check_cap_at_start(1024, SGLangLimits(decode_cuda_graph_max_batch_size=512, tokens_per_request=4), DEEPEP)
    assert f"lower the CUDA-graph batch (--cuda-graph-max-bs-decode): {VARIABLE} takes at most 1024" in caplog.text


def test_a_backend_sglang_checks_itself_gets_no_check():
    assert check_cap_at_start(16, DECODE, FLASHINFER) is None

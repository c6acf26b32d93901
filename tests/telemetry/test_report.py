"""The report model accepts everything sizing and the dispatcher can produce, and nothing else."""

from __future__ import annotations

from typing import get_args

import pytest
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.sizing.flashinfer_releases import SUPPORTED_FLASHINFER_VERSIONS, FlashInferVersion
from capwatch.sizing.payloads import SIZING_PAYLOAD_FORMATS
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import MAX_TOP_K, OverflowKind, OverflowOutcome, PayloadFormat, RankIdentity, Role
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
    assert report.config.payload_format == payload_format and sink.invalid == []


def test_an_unknown_payload_format_is_refused_with_the_choices():
    config = rank_config(cap=64, ep_size=2, hidden_size=256, top_k=4, num_experts=8, backend="torch")
    with pytest.raises(ValidationError, match="deepseek-fp8"):
        config.model_validate({**config.model_dump(), "payload_format": "int3"})


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

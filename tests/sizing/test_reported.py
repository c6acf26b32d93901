"""Buffers capwatch cannot size offline (``sizing/reported.py``): exact at the cap a rank reported them for,
priced in proportion elsewhere and saying so; ``capwatch plan`` for such a backend run as a user runs it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.sizing.checks import SizingError
from capwatch.sizing.reported import (
    MAX_BUFFER_BYTES,
    ReportedPricing,
    largest_reported_within,
    plan_reported,
)
from tests.support.launcher import run_capwatch

GIB = 1 << 30


def test_exact_at_the_reported_cap_and_an_estimate_elsewhere():
    pricing = ReportedPricing(8, 128, 3 * GIB)
    assert pricing.bytes_per_rank(128) == pricing.known_bytes_per_rank(128) == 3 * GIB
    assert pricing.bytes_per_rank(256) == 6 * GIB and pricing.known_bytes_per_rank(256) is None
    assert pricing.bytes_per_rank(1) == -(-3 * GIB // 128)  # rounded up: never under the buffer
    unknown = ReportedPricing(8, None, None)
    assert unknown.known_bytes_per_rank(128) is None
    with pytest.raises(SizingError, match="reported bytes are not known"):
        unknown.bytes_per_rank(128)


@given(cap=st.integers(1, 1 << 20), buffer_cap=st.integers(1, 1 << 20), buffer_bytes=st.integers(1, MAX_BUFFER_BYTES))
def test_the_estimate_grows_with_the_cap_and_holds_the_reported_bytes(cap, buffer_cap, buffer_bytes):
    pricing = ReportedPricing(4, buffer_cap, buffer_bytes)
    assert pricing.bytes_per_rank(cap) <= pricing.bytes_per_rank(cap + 1)
    assert pricing.bytes_per_rank(cap) * buffer_cap >= buffer_bytes * cap  # never below the proportion


def test_the_largest_cap_within_a_budget_and_bad_input_refused():
    plan = largest_reported_within(5 * GIB, 8, 128, GIB, max_cap=1 << 20)
    assert plan.cap == 640 and plan.bytes_per_rank == 5 * GIB and not plan.exact
    assert plan_reported(128, 8, 128, GIB, max_cap=1024).exact
    with pytest.raises(SizingError, match="no cap fits"):
        largest_reported_within(GIB // 2, 8, 128, GIB, max_cap=1 << 20)
    with pytest.raises(SizingError, match="above 1024"):
        plan_reported(2048, 8, 128, GIB, max_cap=1024)
    with pytest.raises(SizingError, match="beyond any GPU"):
        plan_reported(128, 8, 128, MAX_BUFFER_BYTES + 1, max_cap=1024)


def test_capwatch_plan_prices_deepep_v2_from_the_bytes_a_rank_reported():
    def plan(*args: str):
        return run_capwatch("plan", "--backend", "deepep_v2", "--model", "deepseek-v3", "--ep-size", "8", *args,
                            env={"COLUMNS": "200"}, timeout_s=60)

    refused = plan("--cap", "128")
    assert refused.returncode == 2 and "--deepep-v2-buffer-bytes" in refused.stderr, refused.stderr
    result = plan("--cap", "128:256:128", "--deepep-v2-buffer-bytes", str(3 * GIB), "--deepep-v2-buffer-cap", "128",
                  "--json")
    assert result.returncode == 0, result.stderr
    plans = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(p["cap"], p["bytes_per_rank"], p["exact"]) for p in plans] == [(128, 3 * GIB, True), (256, 6 * GIB, False)]
    table = plan("--cap", "256", "--deepep-v2-buffer-bytes", str(3 * GIB), "--deepep-v2-buffer-cap", "128")
    assert table.returncode == 0 and "in proportion" in table.stdout, table.stderr

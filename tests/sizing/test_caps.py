"""The one search for the largest cap within a budget (``sizing.caps.largest_aligned_cap``), which FlashInfer's
planner, DeepEP's pricing and the advisor's budget stage all call: exact for any monotone budget, inside its
range, and asking few questions for a small answer in a wide range."""

import pytest
from capwatch.sizing.caps import largest_aligned_cap
from hypothesis import given
from hypothesis import strategies as st


@given(threshold=st.integers(min_value=0, max_value=1 << 21), alignment=st.integers(min_value=1, max_value=4096),
       max_cap=st.integers(min_value=0, max_value=1 << 20))
def test_the_answer_is_the_largest_aligned_cap_that_fits_and_is_asked_few_times(threshold, alignment, max_cap):
    asked = []

    def fits(cap: int) -> bool:  # monotone: everything up to the threshold fits
        asked.append(cap)
        return cap <= threshold

    answer = largest_aligned_cap(fits, alignment, max_cap)
    expected = min(threshold, max_cap) // alignment * alignment
    assert answer == (expected or None)
    assert all(cap % alignment == 0 and alignment <= cap <= max_cap for cap in asked), "asked outside the range"
    # Galloping first: the questions grow with the answer, not with the range (a plain bisection of a range as
    # wide as 2^20 / alignment asks about log2 of the range even for the smallest answer).
    assert len(asked) <= 2 * ((answer or alignment) // alignment).bit_length() + 1


def test_a_budget_below_the_first_step_or_a_range_below_the_alignment_has_no_answer():
    assert largest_aligned_cap(lambda cap: cap <= 100, 128, 1 << 20) is None
    assert largest_aligned_cap(lambda cap: True, 128, 127) is None
    assert largest_aligned_cap(lambda cap: True, 128, 128) == 128
    with pytest.raises(ValueError, match="alignment must be positive"):
        largest_aligned_cap(lambda cap: True, 0, 1024)


def test_a_pricing_by_formula_answers_within_its_largest_cap_and_says_when_no_cap_fits():
    from dataclasses import dataclass

    from capwatch.sizing.caps import PricedByFormula
    from capwatch.sizing.checks import SizingError

    @dataclass(frozen=True)
    class Linear(PricedByFormula):
        MAX_CAP = 1024
        bytes_per_token: int | None

        def bytes_per_rank(self, cap: int) -> int:
            if self.bytes_per_token is None:
                raise SizingError("not known")
            return cap * self.bytes_per_token

    pricing = Linear(10)
    assert pricing.known_bytes_per_rank(300) == 3000 and Linear(None).known_bytes_per_rank(300) is None
    assert pricing.largest_cap_within(5000) == 384 and pricing.largest_cap_fitting(5000, 64) == 448
    assert pricing.largest_cap_within(10 ** 9) == 1024 and pricing.largest_cap_within(10 ** 9, max_cap=512) == 512
    with pytest.raises(SizingError, match="no cap fits 1000 bytes per rank: the smallest aligned cap, 128, already "
                                          "needs 1280"):
        pricing.largest_cap_fitting(1000)

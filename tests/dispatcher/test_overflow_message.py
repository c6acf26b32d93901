"""An overflow names the backend's own variable and outcome (``sizing/backends.py``): DeepEP checks each rank's own
batch against its cap, at most 1024; FlashInfer a group-wide R."""

from __future__ import annotations

import pytest
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.instrumented import CapOverflowError, InstrumentedDispatcher
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER
from hypothesis import given
from hypothesis import strategies as st


class Place:
    ep_rank, ep_size = 1, 4


def layers(rules, cap: int = 128):
    counters = DispatchCounters(cap, Place.ep_size)
    leader, other = (InstrumentedDispatcher(Place, counters, cap, step_leader=leader, rules=rules)
                     for leader in (True, False))
    return counters, leader, other


def overflow(layer, local_tokens: int) -> CapOverflowError:
    with pytest.raises(CapOverflowError) as raised:
        layer.guard(local_tokens, local_tokens)
    return raised.value


@given(st.integers(129, 1024))
def test_a_deepep_batch_above_the_cap_names_deepeps_variable_and_assertion(local_tokens):
    counters, leader, _ = layers(DEEPEP)
    message = str(overflow(leader, local_tokens))
    aligned = -(-local_tokens // 128) * 128
    assert f"deepep dispatch has {local_tokens} tokens on this rank but the per-rank cap is 128" in message
    assert f"DeepEP's dispatch assertion ends the rank. Set {DEEPEP.cap_env_var}={aligned} (or more)" in message
    snapshot = counters.snapshot()
    assert snapshot.overflow_events_total == 1 and snapshot.forward_steps == 1  # the refused batch is in the histogram
    assert snapshot.max_local_tokens == local_tokens


def test_a_deepep_batch_above_1024_says_to_lower_the_batch_not_an_impossible_cap():
    _, leader, _ = layers(DEEPEP)
    message = str(overflow(leader, 1500))
    assert "1500 is above the 1024 deepep accepts: lower the batch" in message and DEEPEP.cap_env_var not in message


def test_flashinfers_message_is_unchanged():
    _, leader, _ = layers(FLASHINFER)
    message = str(overflow(leader, 300))
    assert "needs 300 tokens per rank (runtime_max_tokens_per_rank)" in message
    assert f"{FLASHINFER.cap_env_var}=384" in message

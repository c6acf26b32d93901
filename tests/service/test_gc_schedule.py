"""Full garbage collections on the service's schedule (``capwatch.service.gc_schedule``): none starts on its own
within the block, where CPython's own thresholds start them; cyclic garbage is still freed, by the scheduled one;
the process's thresholds are put back."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
from capwatch.service.gc_schedule import scheduled_full_collections

DEFAULT_THRESHOLDS = (700, 10, 10)  # CPython's


class _Node:
    def __init__(self):
        self.other = None


def _full_collections_while_growing(objects: int) -> int:
    """How many full collections CPython starts while the heap grows by ``objects`` surviving containers."""
    started = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            started.append(True)

    gc.callbacks.append(count)
    try:
        kept = [[index] for index in range(objects)]  # each a tracked container that survives into the old gen
        del kept
    finally:
        gc.callbacks.remove(count)
    return len(started)


@pytest.fixture
def default_thresholds():
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*DEFAULT_THRESHOLDS)
    gc.enable()  # automatic collections on, whatever ran before in this process
    gc.collect()  # a clean start: the count of objects that survived into the old generation is at 0
    yield
    gc.set_threshold(*before)
    if not enabled:
        gc.disable()


def test_within_the_block_no_full_collection_starts_on_its_own(default_thresholds):
    growth = max(400_000, len(gc.get_objects()))  # several times what makes CPython start one
    assert _full_collections_while_growing(growth) >= 1, "the control: CPython's thresholds start one"
    gc.collect()
    with scheduled_full_collections(interval_s=3600):
        assert _full_collections_while_growing(growth) == 0
    assert gc.get_threshold() == DEFAULT_THRESHOLDS


def _cycle_in_the_old_generation() -> weakref.ref:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gc.collect()  # both survive a full collection: they are in the oldest generation now
    return weakref.ref(first)


def test_cyclic_garbage_waits_for_the_scheduled_collection_and_is_freed_by_it(default_thresholds):
    with scheduled_full_collections(interval_s=3600):
        garbage = _cycle_in_the_old_generation()  # unreachable from here on: only a full collection frees it
        _full_collections_while_growing(100_000)  # many young collections run meanwhile
        assert garbage() is not None
    with scheduled_full_collections(interval_s=0.05):
        garbage = _cycle_in_the_old_generation()
        deadline = time.monotonic() + 30
        while garbage() is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert garbage() is None, "the scheduled full collection did not free the cycle"


def test_the_thresholds_are_put_back_when_the_block_raises(default_thresholds):
    with pytest.raises(RuntimeError), scheduled_full_collections(interval_s=3600):
        assert gc.get_threshold()[:2] == DEFAULT_THRESHOLDS[:2]
        assert gc.get_threshold()[2] > 10**9
        raise RuntimeError("the server stopped")
    assert gc.get_threshold() == DEFAULT_THRESHOLDS


@pytest.mark.parametrize("interval_s", [0, -1.0])
def test_a_non_positive_interval_is_refused_and_changes_nothing(default_thresholds, interval_s):
    with pytest.raises(ValueError, match="interval_s must be > 0"), scheduled_full_collections(interval_s):
        pass
    assert gc.get_threshold() == DEFAULT_THRESHOLDS

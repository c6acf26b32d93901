"""CPython's full garbage collections on the service's schedule, not the allocator's.

A full (generation 2) collection stops every thread of the process while it walks every tracked object. The
service holds about 45 per EP group (rank states, digests: pydantic models, their dicts and sets): at 10,000
groups one walk took 0.6-1.0 s on a 2-core machine. CPython starts one whenever the objects that survived into
the oldest generation grew by a quarter, and a service under a steady write load replaces its digests
continuously: 45 full collections in one benchmark run, each a pause of every read (``benchmarks.many_clusters``
under ~1,800 writes/s: list p99 0.86-1.06 s, where the median is 70-120 ms).

Full collections only find garbage in reference cycles; everything else is freed by reference counting the
moment it is dropped. The service's steady state makes none worth the pause: over that benchmark the deferred
collection found only the objects of a store the benchmark itself closed and replaced. So ``capwatch serve``
keeps CPython's young collections (cheap: they walk only new objects) and runs the full one itself, from a
thread, every ``FULL_COLLECTION_INTERVAL_S``: the same pause, once every ten minutes instead of every few seconds,
and cyclic garbage is still freed within that interval.

The thresholds are the process's own, so this belongs to the process that serves (``capwatch serve``, and the
benchmark that serves as it does), not to ``create_app``: an app built in a test process leaves its collector
alone.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

FULL_COLLECTION_INTERVAL_S = 600.0
# The oldest generation's threshold: how many generation-1 collections may pass between two automatic full ones
# (the largest C int). One runs per ~7,000 net allocations: 1.5e13 of them, weeks at any rate this service
# reaches; and each scheduled full collection starts the count again.
NO_AUTOMATIC_FULL_COLLECTIONS = (1 << 31) - 1


@contextmanager
def scheduled_full_collections(interval_s: float = FULL_COLLECTION_INTERVAL_S) -> Iterator[None]:
    """Within the block, no full collection starts on its own; one runs every ``interval_s`` from a thread of
    its own (and the thresholds as they were are put back on the way out)."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, not {interval_s}")
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], NO_AUTOMATIC_FULL_COLLECTIONS)
    stop = threading.Event()
    thread = threading.Thread(target=_collect_every, args=(interval_s, stop), name="capwatch-gc", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        gc.set_threshold(*thresholds)


def _collect_every(interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        started = time.perf_counter()
        unreachable = gc.collect()
        log.debug("full garbage collection: %d unreachable objects freed in %.0f ms", unreachable,
                  (time.perf_counter() - started) * 1e3)

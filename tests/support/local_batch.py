"""Whether ``InstrumentedDispatcher`` passes each step's local batch to its counters
(``DispatchCounters.record_step(R, local_tokens)``). Until ``dispatcher/instrumented.py`` does
(``_record_step(runtime_tokens, local_tokens)``), ranks driven through it report
``max_local_tokens`` as unknown; the end-to-end tests check the per-rank local line only then, and
the unit tests feed ``record_step`` directly either way."""

from __future__ import annotations

import inspect

from capwatch.dispatcher.instrumented import InstrumentedDispatcher

LOCAL_BATCH_RECORDED = "local_tokens" in inspect.signature(InstrumentedDispatcher._record_step).parameters

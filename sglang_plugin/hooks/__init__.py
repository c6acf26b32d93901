"""One module per A2A backend (``--moe-a2a-backend``): what the plugin hooks in SGLang, per release.

A backend module provides ``NAME``, ``ADAPTERS`` (verified SGLang release -> its adapter),
``problem(adapter, backend_version, newer)`` (why it cannot be instrumented, checked before any hook)
and ``register(session, adapter, source)``; its floor lives in ``floors/<backend>.py``. A second backend
(DeepEP's low-latency dispatcher, next) is one more module here and one in ``floors/``, and one entry below.
"""

from __future__ import annotations

from capwatch.sglang_plugin.hooks import flashinfer

BACKENDS = {flashinfer.NAME: flashinfer}

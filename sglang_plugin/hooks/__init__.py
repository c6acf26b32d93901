"""The SGLang plugin's one registry of A2A backends (``--moe-a2a-backend``): one hook module per backend, per release.

A backend module provides ``NAME``, ``ADAPTERS`` (verified SGLang release -> its adapter), ``FLOOR`` (its floor
module, ``floors/<backend>.py``), ``problem(adapter, backend_version, newer)`` (why it cannot be instrumented,
checked before any hook; the version is None without a ``PACKAGE``; a ``status.BackendUnavailable`` where SGLang
itself cannot build the dispatcher with what is installed, ``status.library_missing`` where its library does not
import) and ``register(session, adapter, source)``; optionally ``PACKAGE`` (its library's distribution, whose
release the plugin reads and reports as ``<NAME>_version``), ``UNSUPPORTED`` (release -> why its hooks do not run
there, for the one line that says so) and ``cap_at_start()`` (where SGLang derives the cap at start: the cap the
dispatchers will be built with and where it comes from, for the start-up check). A backend is one module here,
one in ``floors/`` and one entry below (docs/sglang.md, "Adding a backend"); ``FLOORS`` is derived from it.
"""

from __future__ import annotations

from capwatch.sglang_plugin.hooks import (deepep, deepep_v2, flashinfer, flashinfer_megamoe, megamoe, mooncake, mori,
                                          nixl, pplx)

BACKENDS = {module.NAME: module for module in (flashinfer, deepep, deepep_v2, mooncake, mori, nixl, pplx,
                                                 flashinfer_megamoe, megamoe)}
FLOORS = {name: module.FLOOR for name, module in BACKENDS.items()}  # each backend's floor module, by its name

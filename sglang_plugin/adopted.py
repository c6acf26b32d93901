"""What a ``FlashinferDispatcher`` holds after adoption: its own ``MoeAlltoAll``, counted.

``InstrumentedMoeAlltoAll`` keeps MoeAlltoAll's ``dispatch``/``combine`` calls (the ones SGLang
makes) and forwards everything else to the adopted object. The dispatch runs through capwatch's
:class:`InstrumentedDispatcher` over the object adopted as an ``A2ABackend``: the counter updates
are tensor ops beside the dispatch, so a CUDA graph that captures the dispatch replays them too.
"""

from __future__ import annotations

from capwatch.dispatcher.instrumented import InstrumentedDispatcher


class InstrumentedMoeAlltoAll:
    def __init__(self, alltoall, instrumented: InstrumentedDispatcher):
        self.adopted = alltoall
        self.instrumented = instrumented
        # Bound once: SGLang calls these at every dispatch of every MoE layer.
        self.dispatch = instrumented.dispatch
        self.combine = instrumented.combine

    def __getattr__(self, name):  # get_combine_payload_tensor_in_workspace, workspace, ...
        return getattr(self.adopted, name)

"""capwatch's dispatcher: the A2A wrapper on the hot path (torch). Backends with FlashInfer's
semantics (``backend``, ``torch_backend``, ``flashinfer_backend``), the device counters that survive
CUDA-graph replay (``counters``) and the cap guards (``instrumented``). Sizing lives torch-free in
``capwatch.sizing``."""

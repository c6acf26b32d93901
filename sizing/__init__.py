"""capwatch's sizing, torch-free: what a per-rank cap costs in each A2A backend's workspace.

Each backend's own cap rules (``backends``: alignment, range, what happens below its floor; the variable an engine
reads the cap from is the engine's, ``sglang_engine/caps.py``) and the cap's own rounding and bounds (``caps``); one
module per workspace layout: FlashInfer's (``flashinfer_moe_a2a``, ``flashinfer_one_sided``, the releases that use
each in ``flashinfer_releases``, priced together by ``flashinfer_plan`` for an allocation: FlashInfer's own formula
or a caller's rule), DeepEP's (``deepep_low_latency``, ``deepep_normal``, the buffer's memory and pricing in
``deepep_plan``; how SGLang allocates either is SGLang's, ``sglang_engine/``) and DeepEP v2's (``deepep_v2``, priced from the
bytes a rank reports, ``reported``); payload bytes
per token (``payloads``), published models' geometry (``model_presets``), the input checks (``checks``) and byte
units (``byte_units``). Pure arithmetic: the advisor prices many caps per request with it.
"""

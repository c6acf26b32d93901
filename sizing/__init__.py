"""capwatch's sizing, torch-free: what a per-rank cap costs in each A2A backend's workspace.

Each backend's cap rules (``backends``: its variable, alignment, range, what happens below its floor) and the
cap's own rounding and bounds (``caps``); one module per workspace layout: FlashInfer's (``flashinfer_moe_a2a``,
``flashinfer_one_sided``, the releases that use each in ``flashinfer_releases``, priced together by ``flashinfer_plan``) and
DeepEP's (``deepep_low_latency``, ``deepep_normal``, the buffer SGLang allocates in ``deepep_plan``); payload bytes
per token (``payloads``), published models' geometry (``model_presets``), the input checks (``checks``) and byte
units (``byte_units``). Pure arithmetic: the advisor prices many caps per request with it.
"""

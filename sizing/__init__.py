"""capwatch's sizing, torch-free: what a per-rank cap costs in each A2A backend's workspace.

One module per workspace layout (``flashinfer_moe_a2a``, ``flashinfer_one_sided``), the releases
that use each (``flashinfer_releases``), payload bytes per token (``payloads``), published models'
geometry (``model_presets``), the cap's own rules (``caps``), and the one pricing function over
them all (``plan``). Pure arithmetic: the advisor prices many caps per request with it.
"""

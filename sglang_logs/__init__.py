"""Advice from the SGLang server logs operators already have (``capwatch advise --sglang-log``):
the server args (``server_args``), the decode and overflow lines (``reader``), and the advisor run
over what they show (``advise``). Needs the service's advisor (``a2a-capwatch[service]``'s models),
not the web service."""

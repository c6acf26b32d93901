"""Advice from the SGLang server logs operators already have (``capwatch advise --sglang-log``).

Per file, its lines as records (``log_file``: ``line_shapes`` for the decode and overflow lines, ``stamps``
for their time, ``wrappers`` for log shippers' envelopes, ``server_args`` for the start-up line); the files
merged by time (``reader``) into one timeline of windows per configuration (``timeline``); the advisor
(``capwatch.advisor``) run over the latest configuration's history (``advise``). Needs pydantic and
pydantic-settings (the base install), not the service. ``command`` is its part of ``capwatch advise`` (the
options, found through ``capwatch.engines``: the engine's ``LOG_READER``).
"""

"""SGLang's own series beside ``moe_a2a_info``: ``moe_a2a_sglang_info`` (its limits' categorical values as labels)
and one gauge per term of its start-up floor, read from a rank's ``SGLangLimits`` (``RankConfig.sglang``), absent
on a rank that reports none. ``telemetry/catalogue.py`` makes them metrics; the Prometheus source reads them back
into the limits, a label or gauge left out standing for the field's default."""

from __future__ import annotations

from capwatch.series import GaugeSeries, OwnSeries

SERIES = OwnSeries(
    info_help=(
        "SGLang's resolved start-up settings for this rank's cap (value is always 1; present only under SGLang): "
        "cap_source says who set the cap its dispatcher was built with (capwatch at start, the operator, SGLang's "
        "default), advice_revision the revision of the advice capwatch applied (empty otherwise)."),
    # SGLangLimits' field names; an empty label (a field that is None) is an absent one in Prometheus.
    info_labels=("sglang_version", "disaggregation_mode", "cap_source", "floor_rule", "advice_revision"),
    gauges=(
        GaugeSeries("max_prefill_buffer_tokens",
                    "SGLang's largest prefill chunk (max prefill buffer), a term of its start-up floor for the cap.",
                    "tokens"),
        GaugeSeries("prefill_cuda_graph_max_batch_size",
                    "SGLang's largest prefill CUDA-graph batch in tokens (0: none), a term of its start-up floor for "
                    "the cap.", "tokens", metric="moe_a2a_sglang_prefill_cuda_graph_max_tokens"),
        GaugeSeries("decode_cuda_graph_max_batch_size",
                    "SGLang's largest decode/verify CUDA-graph batch in requests (0: none); times tokens per request, "
                    "a term of its start-up floor for the cap.", "requests",
                    metric="moe_a2a_sglang_decode_cuda_graph_max_requests"),
        GaugeSeries("tokens_per_request",
                    "Tokens each request dispatches per decode/verify step under SGLang (1, or the speculative draft "
                    "tokens).", "tokens"),
    ),
)

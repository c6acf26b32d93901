"""Per-rank detail: which rank runs close to the cap, how R is distributed, the traffic each rank sends and
receives, and every overflow by kind and outcome."""

from __future__ import annotations

from capwatch.dashboards.panels import (
    UTILIZATION_STEPS,
    Query,
    dashboard,
    heatmap_panel,
    labels_table_panel,
    number_panels,
    peak,
    ranks,
    rate,
    row,
    stat_panel,
    timeseries_panel,
)
from capwatch.telemetry import catalogue as cat
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

UID = "capwatch-ep-ranks"
RANK = "ep_group, dispatcher, ep_rank"
RANK_LEGEND = "rank {{ep_rank}}"
RUNTIME_TOKENS_BUCKET = cat.RUNTIME_TOKENS.name + "_bucket"


def _runtime_tokens_quantile(quantile: float) -> str:
    return f"histogram_quantile({quantile}, sum by ({RANK}, le) ({rate(RUNTIME_TOKENS_BUCKET)}))"


def build() -> dashboard_models.Dashboard:
    detail = dashboard(
        "capwatch / EP ranks", UID,
        "Per-rank detail of the MoE all-to-all: utilization of the token cap, the distribution of R, "
        "tokens sent and received, and overflow events.",
    )
    detail = (
        detail
        .with_row(row("Utilization"))
        .with_panel(timeseries_panel(
            "Local batch per rank vs the group's R",
            "Each rank's own largest local batch (the tokens it dispatched in one step) over the trailing peak "
            "window, one line per rank, against the group's R (the largest local batch of any rank, which every "
            "rank dispatches with) and the cap. The rank whose line reaches R drives the group's peak.",
            "short",
            [Query(peak(cat.LOCAL_TOKENS_WINDOW_MAX.name), "rank {{ep_rank}} local batch"),
             Query(f"max by (ep_group, dispatcher) ({peak(cat.RUNTIME_TOKENS_WINDOW_MAX.name)})",
                   "group R {{ep_group}} {{dispatcher}}"),
             Query(f"max by (ep_group, dispatcher) ({ranks(cat.CAP_TOKENS.name)})", "cap {{ep_group}} {{dispatcher}}")],
            width=18, min_value=0))
        .with_panel(stat_panel(
            "Rank driving the peak",
            "The selected rank with the largest own local batch in the trailing peak window: the one that sets "
            "the group's R.",
            "short",
            [Query(f"topk by (ep_group, dispatcher) (1, {peak(cat.LOCAL_TOKENS_WINDOW_MAX.name)})",
                   "{{ep_group}} {{dispatcher}} rank {{ep_rank}}")],
            width=6, height=8)
            .text_mode(common_models.BigValueTextMode.VALUE_AND_NAME))
        .with_panel(timeseries_panel(
            "Group peak utilization",
            "Largest R / cap over the trailing peak window, every step counted whatever the scrape interval (above "
            "1 means overflow). R is one value for the whole group: every rank dispatches with it.",
            "percentunit",
            [Query(f"max by (ep_group, dispatcher) ({peak(cat.RUNTIME_TOKENS_WINDOW_UTILIZATION.name)})",
                   "group {{ep_group}} {{dispatcher}}")],
            width=24, min_value=0, thresholds=UTILIZATION_STEPS))
        .with_panel(timeseries_panel(
            "Peak R per rank vs cap",
            "Largest R over the trailing peak window and since start, against the cap each rank's workspace is "
            "sized for. The counters keep one bin above the cap, so a window that overflowed without setting a new "
            "maximum reads cap + 1.",
            "short",
            [Query(peak(cat.RUNTIME_TOKENS_WINDOW_MAX.name), "rank {{ep_rank}} window peak"),
             Query(ranks(cat.RUNTIME_TOKENS_MAX.name), "rank {{ep_rank}} max since start"),
             Query(f"max by (ep_group, dispatcher) ({ranks(cat.CAP_TOKENS.name)})", "cap {{ep_group}} {{dispatcher}}")],
            min_value=0))
        .with_panel(timeseries_panel(
            "R quantiles per rank",
            "p50 and p99 of R (runtime max tokens per rank per step) over the window, from the histogram.",
            "short",
            [Query(_runtime_tokens_quantile(0.5), "rank {{ep_rank}} p50"),
             Query(_runtime_tokens_quantile(0.99), "rank {{ep_rank}} p99")],
            min_value=0))
        .with_panel(heatmap_panel(
            "R distribution",
            "Steps per R bucket over time for the selected ranks. Buckets are fractions of the cap; the top bucket "
            "ends at the cap, so anything in +Inf overflowed.",
            "short",
            Query(f"sum by (le) ({rate(RUNTIME_TOKENS_BUCKET, 'increase')})", "{{le}}", format="heatmap"),
            width=24))
        .with_row(row("Traffic"))
        .with_panel(timeseries_panel(
            "Tokens sent per rank",
            "Token copies per second each rank sends to expert ranks, from a sample of the MoE layers (what one "
            "copy is and which layers, per backend: the help of moe_a2a_tokens_sent_total).",
            "cps", [Query(rate(cat.TOKENS_SENT.name), RANK_LEGEND)], width=8, min_value=0))
        .with_panel(timeseries_panel(
            "Tokens received per rank",
            "Token copies per second each rank receives from source ranks, from a sample of the MoE layers (none "
            "where the backend counts what is sent only). A rank receiving far more than the others is the one "
            "that sets R.",
            "cps", [Query(rate(cat.TOKENS_RECEIVED.name), RANK_LEGEND)], width=8, min_value=0))
        .with_panel(timeseries_panel(
            "Dispatch calls per forward step",
            "A2A dispatches per forward step: the MoE layers, more when overflows are chunked into rounds.",
            "short",
            [Query(f"sum by ({RANK}) ({rate(cat.DISPATCH_CALLS.name)})"
                   f" / sum by ({RANK}) ({rate(cat.FORWARD_STEPS.name)})", RANK_LEGEND)],
            width=8, min_value=0))
        .with_row(row("Overflow"))
        .with_panel(timeseries_panel(
            "Overflow events by kind and outcome",
            "Dispatches past the cap per window on each rank. runtime_over_cap: R > cap; local_over_runtime: "
            "local tokens > R. raised: the step failed; chunked: split into rounds.",
            "short",
            [Query(f"sum by ({RANK}, kind, outcome) ({rate(cat.OVERFLOW_EVENTS.name, 'increase')})",
                   "rank {{ep_rank}} {{kind}}/{{outcome}}")],
            width=16, min_value=0))
        .with_panel(timeseries_panel(
            "Chunked rounds per second",
            "Cap-sized A2A rounds the chunk overflow policy ran instead of failing: the price of a cap that is "
            "too small (each round is a full dispatch and combine).",
            "ops", [Query(rate(cat.CHUNKED_ROUNDS.name), RANK_LEGEND)], width=8, min_value=0))
        .with_row(row("Reporting to the service"))
        .with_panel(timeseries_panel(
            "Reports pending per rank",
            "Interval reports buffered on each rank until the capwatch service accepts them; a growing backlog "
            "means the service is unreachable and the advice goes stale.",
            "none", [Query(ranks(cat.REPORTS_PENDING.name), RANK_LEGEND)], min_value=0))
        .with_panel(timeseries_panel(
            "Report delivery per rank",
            "Reports per second each rank delivered, failed to send (retried), had refused for good (4xx: a "
            "bad token or schema mismatch) and merged into the next while its buffer was full.",
            "ops",
            [Query(rate(cat.REPORTS_DELIVERED.name), "rank {{ep_rank}} delivered"),
             Query(rate(cat.REPORT_SEND_FAILURES.name), "rank {{ep_rank}} failed"),
             Query(rate(cat.REPORTS_REJECTED.name), "rank {{ep_rank}} rejected"),
             Query(rate(cat.REPORTS_MERGED.name), "rank {{ep_rank}} merged")],
            min_value=0))
        .with_row(row("Memory"))
        .with_panel(timeseries_panel(
            "Workspace bytes per rank",
            "A2A memory of each rank at its cap, by its backend's sizing (its workspace or buffer).",
            "bytes", [Query(ranks(cat.WORKSPACE_BYTES.name), RANK_LEGEND)], min_value=0))
        .with_panel(timeseries_panel(
            "Payload bytes per token",
            "Dispatch payload (hidden states, scales, top-k ids and weights) and combine payload per token.",
            "bytes",
            [Query(ranks(cat.DISPATCH_TOKEN_BYTES.name), "rank {{ep_rank}} dispatch"),
             Query(ranks(cat.COMBINE_TOKEN_BYTES.name), "rank {{ep_rank}} combine")],
            min_value=0))
        .with_panel(labels_table_panel(
            "Rank configuration",
            "Each rank's dispatcher configuration as exported.",
            "none", [Query(ranks(cat.INFO.name), instant=True, format="table")]))
    )
    return number_panels(detail.build())

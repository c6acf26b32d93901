"""The EP-group overview: is any rank close to the cap, is anything overflowing, how much A2A memory (FlashInfer's
workspace, DeepEP's buffer) the group holds, and what the capwatch service recommends instead."""

from __future__ import annotations

from capwatch.dashboards import service_metrics as svc
from capwatch.dashboards.panels import (
    UTILIZATION_STEPS,
    Query,
    dashboard,
    labels_table_panel,
    number_panels,
    peak,
    ranks,
    rate,
    row,
    service,
    stat_panel,
    timeseries_panel,
)
from capwatch.telemetry import catalogue as cat
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

UID = "capwatch-ep-group"
GROUP = "ep_group, dispatcher"
GROUP_LEGEND = "{{ep_group}} {{dispatcher}}"

# The trailing-window peak misses no step between scrapes (the last-interval gauge is only sampled).
group_peak_utilization = f"max by ({GROUP}) ({peak(cat.RUNTIME_TOKENS_WINDOW_UTILIZATION.name)})"
# p99 of R over the window divided by the cap: numerator and denominator aggregated separately.
group_p99_utilization = (
    f"histogram_quantile(0.99, sum by ({GROUP}, le) ({rate(cat.RUNTIME_TOKENS.name + '_bucket')}))"
    f" / on ({GROUP}) max by ({GROUP}) ({ranks(cat.CAP_TOKENS.name)})"
)
group_workspace_bytes = f"sum by ({GROUP}) ({ranks(cat.WORKSPACE_BYTES.name)})"


def build() -> dashboard_models.Dashboard:
    overview = dashboard(
        "capwatch / EP group overview", UID,
        "One EP group at a glance: utilization of the per-rank A2A token cap, overflows, workspace memory "
        "and the capwatch service's recommended cap.",
    )
    overview = (
        overview
        .with_row(row("At a glance"))
        .with_panel(stat_panel(
            "Group peak utilization",
            "Largest R / cap over the ranks in the trailing peak window (moe_a2a_peak_window_seconds, 60 s by "
            "default), whatever the scrape interval. 1.0 means a rank hit the cap.",
            "percentunit", [Query(group_peak_utilization, GROUP_LEGEND)], thresholds=UTILIZATION_STEPS))
        .with_panel(stat_panel(
            "Overflow rate",
            "Dispatches past the cap per second, all ranks, all kinds. Anything above zero raised or chunked.",
            "cps",
            [Query(f"sum by (ep_group) ({rate(cat.OVERFLOW_EVENTS.name)})", "{{ep_group}}")],
            thresholds=[(None, "green"), (1e-9, "red")]))
        .with_panel(stat_panel(
            "Ranks scraped",
            "Ranks Prometheus scrapes for this group now; compare with ep_size in the configuration table.",
            "none", [Query(f"count by ({GROUP}) ({ranks(cat.INFO.name)})", GROUP_LEGEND)]))
        .with_panel(stat_panel(
            "Cap: current / recommended",
            "The cap the ranks run with and the cap the capwatch service recommends (absent until it has enough "
            "history).",
            "short",
            [Query(service(svc.CLUSTER_CAP_TOKENS), "current {{ep_group}}"),
             Query(service(svc.RECOMMENDED_CAP_TOKENS), "recommended {{ep_group}}")]))
        .with_panel(stat_panel(
            "Workspace across the group",
            "A2A memory summed over the ranks, by each backend's sizing: its workspace or buffer as the engine "
            "allocates it.",
            "bytes", [Query(group_workspace_bytes, GROUP_LEGEND)]))
        .with_panel(stat_panel(
            "Advice",
            "The capwatch service's current action for the cap: raise, lower, hold or insufficient_data.",
            "none", [Query(f"{service(svc.ADVICE_ACTION)} == 1", "{{ep_group}}: {{action}}")])
            .text_mode(common_models.BigValueTextMode.NAME))
        .with_row(row("Utilization and overflow"))
        .with_panel(timeseries_panel(
            "Group max utilization",
            "Largest R / cap over the group's ranks (every step counts, whatever the scrape interval), and p99 of R "
            "over the window / cap. "
            "The dashed lines mark 0.75 and the saturating alert's 0.9.",
            "percentunit",
            [Query(group_peak_utilization, "peak " + GROUP_LEGEND),
             Query(group_p99_utilization, "p99 " + GROUP_LEGEND)],
            width=16, min_value=0, thresholds=UTILIZATION_STEPS))
        .with_panel(timeseries_panel(
            "Overflow rate by kind and outcome",
            "runtime_over_cap: R exceeded the cap; local_over_runtime: a rank's own tokens exceeded R. "
            "Outcome raised (the step failed) or chunked (split into rounds).",
            "cps",
            [Query(f"sum by (ep_group, kind, outcome) ({rate(cat.OVERFLOW_EVENTS.name)})",
                   "{{ep_group}} {{kind}} {{outcome}}")],
            width=8, min_value=0))
        .with_row(row("Throughput"))
        .with_panel(timeseries_panel(
            "Forward steps per second",
            "Forward steps through the A2A per second; the ranks of a group step together, so this is the "
            "fastest rank's rate.",
            "ops",
            [Query(f"max by ({GROUP}) ({rate(cat.FORWARD_STEPS.name)})", GROUP_LEGEND)],
            min_value=0))
        .with_panel(timeseries_panel(
            "Tokens sent and received across the group",
            "Token copies per second the group's ranks sent to and received from each other.",
            "cps",
            [Query(f"sum by ({GROUP}) ({rate(cat.TOKENS_SENT.name)})", "sent " + GROUP_LEGEND),
             Query(f"sum by ({GROUP}) ({rate(cat.TOKENS_RECEIVED.name)})", "received " + GROUP_LEGEND)],
            min_value=0))
        .with_row(row("Memory and cap"))
        .with_panel(timeseries_panel(
            "Workspace bytes per rank",
            "A2A workspace each rank holds at its cap, and what one rank would hold at the recommended cap.",
            "bytes",
            [Query(ranks(cat.WORKSPACE_BYTES.name), "rank {{ep_rank}}"),
             Query(service(svc.RECOMMENDED_WORKSPACE_BYTES), "recommended per rank {{ep_group}}")],
            width=8, min_value=0))
        .with_panel(timeseries_panel(
            "Workspace bytes across the group",
            "Sum over the ranks Prometheus scrapes, and the service's figure from the ranks' reports.",
            "bytes",
            [Query(group_workspace_bytes, "scraped " + GROUP_LEGEND),
             Query(service(svc.CLUSTER_WORKSPACE_BYTES), "service {{ep_group}}")],
            width=8, min_value=0))
        .with_panel(timeseries_panel(
            "Cap: current vs recommended",
            "The cap the ranks report, and the service's recommended cap with its lower and upper bounds.",
            "short",
            [Query(f"max by ({GROUP}) ({ranks(cat.CAP_TOKENS.name)})", "cap " + GROUP_LEGEND),
             Query(service(svc.RECOMMENDED_CAP_TOKENS), "recommended {{ep_group}}"),
             Query(service(svc.RECOMMENDED_CAP_LOWER_TOKENS), "lower bound {{ep_group}}"),
             Query(service(svc.RECOMMENDED_CAP_UPPER_TOKENS), "upper bound {{ep_group}}")],
            width=8, min_value=0))
        .with_row(row("Consistency"))
        .with_panel(timeseries_panel(
            "Consistency findings",
            "Active findings by kind from the service: cap or ep_size mismatch between ranks, double-counted "
            "workspace, missing or stale ranks. Zero is healthy.",
            "none",
            [Query(f"sum by (ep_group, finding) ({service(svc.CONSISTENCY_FINDINGS)})", "{{ep_group}} {{finding}}")],
            min_value=0))
        .with_panel(timeseries_panel(
            "Ranks reporting / missing",
            "Ranks by state in the service (reporting, stale, missing) and ranks Prometheus scrapes now.",
            "none",
            [Query(f"sum by (ep_group, state) ({service(svc.RANKS)})", "{{ep_group}} {{state}}"),
             Query(f"count by ({GROUP}) ({ranks(cat.INFO.name)})", "scraped " + GROUP_LEGEND)],
            min_value=0))
        .with_panel(labels_table_panel(
            "Rank configuration",
            "Each rank's dispatcher configuration as exported: ep_size, the A2A backend and the variable that "
            "sets its cap (a2a_backend, cap_variable), backend, its backend's parameters ("
            + ", ".join(label for labels in cat.SHARED_INFO_LABELS.values() for label in labels)
            + ") and overflow policy. Ranks of one group should agree.",
            "none", [Query(ranks(cat.INFO.name), instant=True, format="table")]))
    )
    return number_panels(overview.build())

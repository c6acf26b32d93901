"""Building blocks shared by the capwatch dashboards: the datasource, the variables, the label filters and
panel constructors that always set what the dashboard linter asks for (datasource, unit, description).

Every panel and every target points at ``${datasource}``; every query filters on the variables, so picking a
cluster, a dispatcher or a set of ranks narrows every panel at once.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from capwatch.telemetry.catalogue import CAP_TOKENS, FORWARD_STEPS, INFO, OVERFLOW_EVENTS

DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
IMPORT_INPUT = "DS_PROMETHEUS"  # the one input Grafana's import asks for (generate.py writes __inputs)
TAGS = ["capwatch", "moe", "all-to-all"]

# Filters, innermost first: the service's gauges carry ep_group and dispatcher; the ranks add ep_rank.
CLUSTER_FILTER = 'ep_group=~"$ep_group"'
GROUP_FILTER = f'{CLUSTER_FILTER}, dispatcher=~"$dispatcher"'
RANK_FILTER = f'{GROUP_FILTER}, ep_rank=~"$ep_rank"'


def ranks(metric: str) -> str:
    """Selector for a per-rank series narrowed to the selected cluster, dispatcher and ranks."""
    return f"{metric}{{{RANK_FILTER}}}"


def service(metric: str) -> str:
    """Selector for a per-cluster gauge of the capwatch service narrowed to the selected clusters and
    dispatchers (target or draft: each has its own cap and advice)."""
    return f"{metric}{{{GROUP_FILTER}}}"


def rate(metric: str, function: Literal["rate", "increase", "irate"] = "rate") -> str:
    """``rate(metric{filters}[$__rate_interval])``: Grafana widens the window to at least four scrapes."""
    return f"{function}({ranks(metric)}[$__rate_interval])"


def peak(metric: str) -> str:
    """``max_over_time(metric{filters}[$__rate_interval])``: each point is the largest value since the previous
    one (at least four scrapes), so a zoomed-out graph keeps every peak instead of sampling."""
    return f"max_over_time({ranks(metric)}[$__rate_interval])"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    format: Literal["time_series", "table", "heatmap"] = "time_series"


def _targets(queries: list[Query]) -> list[prometheus.Dataquery]:
    targets = []
    for ref_id, query in zip(string.ascii_uppercase, queries, strict=False):
        target = (
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .expr(query.expr)
            .legend_format(query.legend or "__auto")
            .ref_id(ref_id)
            .format(prometheus_models.PromQueryFormat(query.format))
        )
        targets.append(target.instant() if query.instant else target.range())
    return targets


def _thresholds(steps: list[tuple[float | None, str]]) -> dashboard_builders.ThresholdsConfig:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=value, color=color) for value, color in steps])
    )


# Utilization colours: green well below the cap, amber close to it, red at the saturating alert's 0.9.
UTILIZATION_STEPS: list[tuple[float | None, str]] = [(None, "green"), (0.75, "orange"), (0.9, "red")]


def timeseries_panel(
    title: str, description: str, unit: str, queries: list[Query], *,
    width: int = 12, height: int = 8, min_value: float | None = None, max_value: float | None = None,
    thresholds: list[tuple[float | None, str]] | None = None, stacked: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title).description(description).unit(unit).datasource(DATASOURCE)
        .targets(_targets(queries))
        .span(width).height(height)
        .fill_opacity(10).line_width(1).show_points(common_models.VisibilityMode.NEVER)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.TABLE)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if thresholds:
        panel = panel.thresholds(_thresholds(thresholds)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common_models.GraphThresholdsStyleMode.DASHED)
        )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL))
    return panel


def stat_panel(
    title: str, description: str, unit: str, queries: list[Query], *,
    width: int = 4, height: int = 4, thresholds: list[tuple[float | None, str]] | None = None,
    reducer: str = "lastNotNull",
) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title).description(description).unit(unit).datasource(DATASOURCE)
        .targets(_targets(queries))
        .span(width).height(height)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .color_mode(common_models.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs([reducer]).values(False))
    )
    return panel.thresholds(_thresholds(thresholds or [(None, "text")]))


def heatmap_panel(
    title: str, description: str, unit: str, query: Query, *, width: int = 12, height: int = 9,
) -> heatmap.Panel:
    """A heatmap of pre-bucketed counts (``format: heatmap``): Grafana draws the buckets Prometheus has."""
    return (
        heatmap.Panel()
        .title(title).description(description).unit(unit).datasource(DATASOURCE)
        .targets(_targets([query]))
        .span(width).height(height)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit).axis_label("R (tokens per rank per step)"))
        .cell_values(heatmap.CellValues().unit("short"))
        .color(heatmap.HeatmapColorOptions().mode(heatmap_models.HeatmapColorMode.SCHEME).scheme("Oranges").steps(64).exponent(0.5).fill("dark-orange"))
        .show_legend()
    )


def labels_table_panel(
    title: str, description: str, unit: str, queries: list[Query], *, width: int = 24, height: int = 7,
) -> table.Panel:
    # Label columns only: for info-style series the sample value is always 1 and says nothing.
    hide = dashboard_models.DataTransformerConfig(
        id_val="organize", options={"excludeByName": {"Time": True, "Value": True, "__name__": True}})
    return (
        table.Panel()
        .title(title).description(description).unit(unit).datasource(DATASOURCE)
        .targets(_targets(queries))
        .span(width).height(height)
        .with_transformation(hide)
    )


def row(title: str) -> dashboard_builders.Row:
    return dashboard_builders.Row(title)


def _query_variable(name: str, label: str, query: str, description: str) -> dashboard_builders.QueryVariable:
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .multi(True)
        .include_all(True)
        .all_value(".+")
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_models.VariableSort.NATURAL_ASC)
        .current(dashboard_models.VariableOption(selected=True, text="All", value="$__all"))
    )


def variables() -> list:
    """``datasource`` first (everything else queries through it), then EP group, dispatcher and rank."""
    return [
        dashboard_builders.DatasourceVariable("datasource")
        .label("Data source")
        .description("The Prometheus that scrapes the ranks and the capwatch service.")
        .type("prometheus")
        # Grafana's import asks for the input and puts the chosen datasource here; provisioned as is, the value
        # matches no datasource and Grafana starts on its default Prometheus.
        .current(dashboard_models.VariableOption(text="Prometheus", value=f"${{{IMPORT_INPUT}}}")),
        _query_variable(
            "ep_group", "EP group", f"label_values({INFO.name}, ep_group)",
            "EP group (deployment: CAPWATCH_CLUSTER) as the ranks label it."),
        _query_variable(
            "dispatcher", "Dispatcher", f'label_values({INFO.name}{{{CLUSTER_FILTER}}}, dispatcher)',
            "Which A2A dispatcher of the rank (e.g. the target model or a speculative draft)."),
        _query_variable(
            "ep_rank", "EP rank", f'label_values({INFO.name}{{{GROUP_FILTER}}}, ep_rank)',
            "Expert-parallel ranks to show."),
    ]


# Where a person looks first: overflows, cap changes and restarts as annotations on every time series, per
# (group, dispatcher[, rank]) in the selection. A restart shows where the same target comes back (a container
# restarted in its pod resets its counters); a new pod is a new series, seen as the rank's line starting.
ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    ("Overflows", "red", f"sum by (ep_group, dispatcher, kind, outcome) "
                         f"(increase({OVERFLOW_EVENTS.name}{{{GROUP_FILTER}}}[$__rate_interval])) > 0"),
    ("Cap changes", "orange", f"changes({CAP_TOKENS.name}{{{RANK_FILTER}}}[$__rate_interval]) > 0"),
    ("Restarts", "purple", f"resets({FORWARD_STEPS.name}{{{RANK_FILTER}}}[$__rate_interval]) > 0"),
)


def annotations() -> list:
    return [dashboard_builders.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color)
            .expr(expr) for name, color, expr in ANNOTATIONS]


def dashboard(title: str, uid: str, description: str) -> dashboard_builders.Dashboard:
    builder = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .readonly()  # generated: edits belong in dashboards/*.py, not in the UI
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(variables())
        .annotations(annotations())
        .link(
            dashboard_builders.DashboardLink("capwatch")
            .type(dashboard_models.DashboardLinkType.DASHBOARDS)
            .tags(["capwatch"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    return builder


def number_panels(built: dashboard_models.Dashboard) -> dashboard_models.Dashboard:
    """Give every panel a stable, unique id (Grafana links and the linter key panels by id)."""
    for panel_id, panel in enumerate(built.panels or [], start=1):
        panel.id_val = panel_id
    return built

"""The PromQL pieces the source composes: a rank series selector, and each series' value over one window."""

from __future__ import annotations

from capwatch.telemetry import catalogue


def selector(cluster: str, role: str | None = None, **extra: str) -> str:
    """``{ep_group="...", dispatcher="...", ...}``, the values escaped as PromQL strings."""
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    labels = {catalogue.GROUP_LABEL: cluster, **({"dispatcher": role} if role else {}), **extra}
    return "{" + ", ".join(f'{name}="{quoted(value)}"' for name, value in labels.items()) + "}"


def duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def in_window(spec: catalogue.MetricSpec, series_selector: str, window_s: float) -> str:
    """Each series' value over the window ending at the evaluation time: a gauge's largest sample; a
    counter's growth in whole events (``increase`` extrapolates to the window's edges: 31 events in a
    window can read 32, and one the scrape before the window saw can count in it). The growth counts
    from the value a window earlier, or from the first sample in the window for a series that began
    there (a rank Prometheus starts scraping is not credited its whole past); after a reset (a sample
    below that start: the rank restarted) it is the value since the reset."""
    series, window = f"{spec.name}{series_selector}", duration(window_s)
    if spec.type == "gauge":
        return f"max_over_time({series}[{window}])"
    if spec.type == "counter":
        start = f"{series} offset {window}"
        reset = f"(min_over_time({series}[{window}]) < {start})"
        growth = f"({series} - ({start} or min_over_time({series}[{window}])))"
        return f"(({growth} unless {reset}) or {series})"
    raise ValueError(f"{spec.name} is a {spec.type}: no value per window")

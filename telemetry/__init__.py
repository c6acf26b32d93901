"""capwatch's per-rank telemetry.

``catalogue`` (metric names), ``report`` (the report schema shared with the service),
``intervals`` (snapshots -> intervals), ``collector`` + ``exporter`` (Prometheus, scrape time),
``reporter`` (background posting to the service), ``rank`` (``RankTelemetry``: all of it for one
rank). Nothing here is imported by the dispatcher: the hot path only bumps device counters.
"""

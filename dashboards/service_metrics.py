"""Names of the capwatch service's own metrics (its ``/metrics``), as agreed in the service contract.

The per-rank names come from ``telemetry.catalogue``; these are the service's. The end-to-end test scrapes
the real service and fails if any of them is missing, so a rename on either side shows up there.
"""

from __future__ import annotations

CLUSTER_CAP_TOKENS = "capwatch_cluster_cap_tokens"
RECOMMENDED_CAP_TOKENS = "capwatch_recommended_cap_tokens"
RECOMMENDED_CAP_LOWER_TOKENS = "capwatch_recommended_cap_lower_tokens"
RECOMMENDED_CAP_UPPER_TOKENS = "capwatch_recommended_cap_upper_tokens"
RECOMMENDED_WORKSPACE_BYTES = "capwatch_recommended_workspace_bytes"
CLUSTER_WORKSPACE_BYTES = "capwatch_cluster_workspace_bytes"
ADVICE_ACTION = "capwatch_advice_action"
CONSISTENCY_FINDINGS = "capwatch_consistency_findings"
RANKS = "capwatch_ranks"
REPORTS_INGESTED = "capwatch_reports_ingested_total"
REPORTS_DUPLICATE = "capwatch_reports_duplicate_total"
REPORTS_REJECTED = "capwatch_reports_rejected_total"
INGEST_LATENCY_SECONDS = "capwatch_ingest_latency_seconds"
CONNECTIONS_DROPPED = "capwatch_connections_dropped_total"
STORE_CLUSTERS = "capwatch_store_clusters"
STORE_CLUSTERS_LIMIT = "capwatch_store_clusters_limit"
STORE_RANKS = "capwatch_store_ranks"
STORE_RANKS_LIMIT = "capwatch_store_ranks_limit"
STORE_DATABASE_LOST = "capwatch_store_database_lost"

SERVICE_METRICS: tuple[str, ...] = (
    CLUSTER_CAP_TOKENS, RECOMMENDED_CAP_TOKENS, RECOMMENDED_CAP_LOWER_TOKENS, RECOMMENDED_CAP_UPPER_TOKENS,
    RECOMMENDED_WORKSPACE_BYTES, CLUSTER_WORKSPACE_BYTES, ADVICE_ACTION, CONSISTENCY_FINDINGS, RANKS,
    REPORTS_INGESTED, REPORTS_DUPLICATE, REPORTS_REJECTED, INGEST_LATENCY_SECONDS, CONNECTIONS_DROPPED,
    STORE_CLUSTERS, STORE_CLUSTERS_LIMIT, STORE_RANKS, STORE_RANKS_LIMIT, STORE_DATABASE_LOST,
)

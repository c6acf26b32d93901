"""The service's HTTP routes, one module per resource; ``capwatch.service.main.create_app`` includes
each module's ``router`` and puts the middleware in front.

| module | answers |
|---|---|
| ``reports`` | ``POST /v1/reports``, mostly answered **before routing** by ``reports.ReportFastPath`` (below) |
| ``clusters`` | ``GET /v1/clusters``, ``/v1/clusters/{cluster}``, ``/v1/clusters/{cluster}/history`` |
| ``advice`` | ``GET /v1/clusters/{cluster}/advice``, ``/v1/clusters/{cluster}/whatif`` |
| ``health`` | ``GET /healthz`` |
| ``metrics`` | ``GET /metrics`` (the service's own Prometheus series) |
| ``web`` | ``GET /`` and ``/web/{name}`` (the built-in page) |

In front of every route: ``capwatch.service.api.guard.RequestGuard`` (Host check), then
``reports.ReportFastPath``, ASGI middleware that answers every ``POST /v1/reports`` declaring its body size (as
ranks do) without the router; the route ``post_report`` answers the rest (chunked bodies) and documents the
endpoint. Both answer through ``reports.answer``, with the same rules (``capwatch.service.api.report_rules``).
"""

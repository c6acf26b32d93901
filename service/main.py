"""The app factory: settings, store (or a Prometheus source), clock and metrics registry are
passed in, so tests and benchmarks build as many independent apps as they like."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry
from pydantic.json_schema import models_json_schema

from capwatch.backends import SPECS
from capwatch.service.api.guard import RequestGuard
from capwatch.service.api.history_stream import HistoryWorkers
from capwatch.service.api.report_rules import BodyGate, HeavyBodies
from capwatch.service.api.routes import advice, clusters, health, metrics, reports, web
from capwatch.service.config import Settings
from capwatch.service.digests import GroupDigests
from capwatch.service.metrics import build_metrics
from capwatch.service.sources.contract import ClusterSource, SourceUnavailable
from capwatch.service.sources.prometheus.source import PrometheusSource
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.exposition import ExpositionRegistry
from capwatch.telemetry.report import RankReport

DESCRIPTION = f"""Aggregates the interval reports of every EP rank, keeps their history durably, and advises
raise / lower / hold on the per-rank token cap of MoE all-to-all dispatch
({", ".join(f"`{spec.rules.cap_env_var}`" for spec in SPECS.values())}), priced in the bytes of each backend's \
workspace or buffer."""


def store_options(settings: Settings) -> StoreOptions:
    return StoreOptions(window_s=settings.window_s, fold_after_s=settings.fold_after_s,
                        retention_s=settings.retention_s, maintenance_interval_s=settings.maintenance_interval_s,
                        max_batch_reports=settings.max_batch_reports, max_clusters=settings.max_clusters,
                        max_ranks=settings.max_ranks, policy=settings.advisor)


def _install_openapi(app: FastAPI) -> None:
    """The report body is validated by hand (strict JSON mode); publish its schema as a component."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            _, definitions = models_json_schema([(RankReport, "validation")],
                                                ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(definitions.get("$defs", {}))
            # The token is optional (CAPWATCH_TOKEN): declared, and required only when configured.
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["paths"]["/v1/reports"]["post"]["security"] = [{"bearer": []}, {}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class CapwatchApp(FastAPI):
    """The FastAPI app with the request guard outside everything, Starlette's error handler included: its rules
    and security headers hold for every answer, a 500 too."""

    def build_middleware_stack(self):
        return RequestGuard(super().build_middleware_stack(), self.state.settings)


def create_app(settings: Settings | None = None, store: Store | None = None,
               clock: Callable[[], float] | None = None, registry: CollectorRegistry | None = None,
               source: ClusterSource | None = None) -> FastAPI:
    settings = settings or Settings()
    clock = clock or time.time
    registry = registry if registry is not None else ExpositionRegistry(legacy_group_label=settings.legacy_cluster_label)
    owned_store = None
    if source is None and store is None:
        if settings.prometheus_url:
            source = PrometheusSource(settings.prometheus_url, settings, clock)
        else:
            store = owned_store = Store(settings.db_path, store_options(settings), clock)
    if source is None:
        source = store

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if store is not None:  # what the list needs, computed before the first read and then kept current
            await asyncio.to_thread(digests.warm)
            digests.start_refresher()
        yield
        digests.stop_refresher()
        heavy_bodies.close()
        if owned_store is not None:
            owned_store.close()  # drains the writer: every acknowledged report is already committed
        if hasattr(source, "close") and source is not store:
            source.close()

    # Swagger UI loads its script from a CDN: off unless asked for (CAPWATCH_DOCS); /openapi.json is always there.
    app = CapwatchApp(title="capwatch service", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url="/docs" if settings.docs else None, redoc_url=None)
    app.state.settings = settings
    app.state.store = store
    app.state.source = source
    app.state.clock = clock
    app.state.digests = digests = GroupDigests(source, settings, clock)
    app.state.metrics = build_metrics(registry, digests, store)
    for module in (reports, clusters, advice, health, metrics, web):
        app.include_router(module.router)
    app.state.body_gate = BodyGate(settings)
    app.state.heavy_bodies = heavy_bodies = HeavyBodies(settings)
    app.state.history_workers = HistoryWorkers()
    app.add_middleware(reports.ReportFastPath)  # answers POST /v1/reports before routing (routes/__init__.py)

    @app.exception_handler(SourceUnavailable)
    async def source_unavailable(_: Request, error: SourceUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503)

    _install_openapi(app)
    return app

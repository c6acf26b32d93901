"""``capwatch serve``: run the capwatch service (FastAPI on uvicorn)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the service that aggregates rank reports and advises on the cap",
        description=("Run the capwatch service: POST /v1/reports from every rank, one view per EP group, and "
                     "raise/lower/hold advice on the per-rank cap. Every flag can also be set as a CAPWATCH_* "
                     "environment variable (CAPWATCH_TOKEN, CAPWATCH_DB_PATH, ...); flags win."))
    parser.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, help="port to bind (default 8321)")
    parser.add_argument("--db", dest="db_path", help="SQLite database file (default ./capwatch.db)")
    parser.add_argument("--token", help="bearer token required on POST /v1/reports (prefer CAPWATCH_TOKEN: "
                                        "a flag is visible in the process list)")
    parser.add_argument("--prometheus-url", help="read the ranks from this Prometheus server instead of reports")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import uvicorn

    from capwatch.cli import CommandError
    from service.config import Settings
    from service.main import create_app

    overrides = {name: getattr(args, name) for name in ("host", "port", "db_path", "token", "prometheus_url")
                 if getattr(args, name) is not None}
    settings = Settings(**overrides)
    if settings.db_path.parent and not settings.db_path.parent.exists() and not settings.prometheus_url:
        raise CommandError(f"the directory of --db {settings.db_path} does not exist; create it or pick another path")
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.token is None:
        print(f"capwatch serve: warning: listening on {settings.host} without a token: anyone who can reach it "
              "can post reports; set CAPWATCH_TOKEN", file=sys.stderr)
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=False)
    return 0

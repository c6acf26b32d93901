"""The two baselines the ingest benchmark runs beside the real service, as uvicorn app factories:
a bare FastAPI endpoint (the HTTP stack's ceiling) and the naive durable design (validate, then
one SQLite transaction and fsync per request)."""

from __future__ import annotations

import os
import sqlite3
import threading

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from capwatch.telemetry.report import RankReport

ACK = b'{"accepted":true,"duplicate":false}'


def bare_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/reports", status_code=202)
    async def post_report(request: Request) -> Response:
        await request.body()
        return Response(ACK, status_code=202, media_type="application/json")

    return app


def naive_app() -> FastAPI:
    connection = sqlite3.connect(os.environ["CAPWATCH_BENCH_DB"], check_same_thread=False, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute("CREATE TABLE IF NOT EXISTS reports (boot_id TEXT, sequence INTEGER, payload TEXT, "
                       "UNIQUE (boot_id, sequence))")
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/v1/reports", status_code=202)
    async def post_report_async(request: Request) -> Response:
        body = await request.body()
        try:
            report = RankReport.model_validate_json(body)
        except ValidationError as error:
            return Response(str(error), status_code=422)

        def commit() -> None:
            with lock:  # one transaction, one fsync, per request
                connection.execute("BEGIN")
                connection.execute("INSERT OR IGNORE INTO reports VALUES (?, ?, ?)",
                                   (report.identity.boot_id, report.sequence, body.decode()))
                connection.execute("COMMIT")

        await run_in_threadpool(commit)
        return Response(ACK, status_code=202, media_type="application/json")

    return app

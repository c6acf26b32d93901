"""Prometheus' HTTP API, as the source asks it: instant and range queries, label values. Any failure to
answer is ``SourceUnavailable`` (503), saying what went wrong."""

from __future__ import annotations

import httpx

from capwatch.service.sources.contract import SourceUnavailable

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series in one range query


class PrometheusAPI:
    def __init__(self, url: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, timeout=timeout_s)

    def get(self, path: str, params: dict) -> dict | list:
        try:
            response = self.client.get(path, params=params)
        except httpx.HTTPError as error:
            raise SourceUnavailable(f"cannot reach Prometheus at {self.url}: {error}") from None
        try:
            body = response.json()
        except ValueError:
            raise SourceUnavailable(f"Prometheus at {self.url} answered {response.status_code} without JSON") from None
        if body.get("status") != "success":
            raise SourceUnavailable(f"Prometheus query failed: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expression: str, at_unix_s: float) -> list[dict]:
        return self.get("/api/v1/query", {"query": expression, "time": at_unix_s})["result"]

    def query_range(self, expression: str, start: float, end: float, step: float) -> list[dict]:
        return self.get("/api/v1/query_range", {"query": expression, "start": start, "end": end, "step": step})["result"]

    def close(self) -> None:
        self.client.close()

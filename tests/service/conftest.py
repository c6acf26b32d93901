from __future__ import annotations

import warnings

import pytest

warnings.filterwarnings("ignore", message=".*httpx2.*")
from fastapi.testclient import TestClient  # noqa: E402

from capwatch.service.config import Settings  # noqa: E402
from capwatch.service.main import create_app, store_options  # noqa: E402
from capwatch.service.store.sqlite import Store  # noqa: E402

T0 = 1_700_000_000.0
# What every rank sends with a report (the service refuses other content types with 415).
JSON = {"Content-Type": "application/json"}


class FakeClock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(db_path=tmp_path / "capwatch.db", maintenance_interval_s=3600.0)


@pytest.fixture
def store(settings, clock):
    store = Store(settings.db_path, store_options(settings), clock)
    yield store
    store.close()


@pytest.fixture
def client(settings, store, clock):
    with TestClient(create_app(settings, store=store, clock=clock), base_url="http://localhost", headers=JSON) as client:
        yield client

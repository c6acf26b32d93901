"""The built-in page, served by the real app: its assets are the package's files, read through the installed
name, and it links only to what the service serves (Swagger UI is linked only when CAPWATCH_DOCS turns it on)."""

from __future__ import annotations

from html.parser import HTMLParser
from importlib import resources

import pytest
from capwatch.service.api.routes.web import ASSETS
from capwatch.service.config import Settings
from capwatch.service.main import create_app
from fastapi.testclient import TestClient

from tests.support.checkout import REPO_ROOT


class Links(HTMLParser):
    """Every ``href`` and ``src`` of a page, in order."""

    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.targets += [value for name, value in attrs if name in ("href", "src") and value]


@pytest.fixture(params=[False, True], ids=["docs off", "docs on"])
def client(request, tmp_path):
    settings = Settings(db_path=tmp_path / "capwatch.db", docs=request.param, maintenance_interval_s=3600.0)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        yield client


def test_every_link_on_the_page_is_served(client):
    page = client.get("/")
    assert page.status_code == 200
    links = Links()
    links.feed(page.text)
    assert {"openapi.json", "v1/clusters", "metrics", "web/app.js", "web/style.css"} <= set(links.targets)
    docs_on = client.app.state.settings.docs
    assert ("docs" in links.targets) == docs_on, links.targets
    assert (client.get("/docs").status_code == 200) == docs_on
    for target in links.targets:
        assert client.get(f"/{target}").status_code == 200, f"the page links to {target}, which is not served"


def test_each_asset_is_the_packaged_file_read_through_the_installed_name(client):
    packaged = resources.files("capwatch.service").joinpath("web")
    for name in ASSETS:
        served = client.get(f"/web/{name}")
        assert served.status_code == 200
        assert served.text == packaged.joinpath(name).read_text() == (REPO_ROOT / "service/web" / name).read_text()

"""The built-in web page: ``/`` and its static assets, shipped inside the package (no CDN,
machines are often offline). Include with ``app.include_router(web.router)``."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

router = APIRouter(tags=["web"])

_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8"}
# Only these files are served: no path from the request ever reaches the file system.
ASSETS = ("index.html", "app.js", "charts.js", "style.css")
# Where the page names Swagger UI: only when the app serves it (CAPWATCH_DOCS), so the page never links to a 404.
DOCS_LINK_SLOT = "<!--docs link-->"


def _read_asset(name: str) -> str:
    # Through the installed name: ``capwatch.service`` is the only one an install has.
    return resources.files("capwatch.service").joinpath("web", name).read_text(encoding="utf-8")


@router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse, include_in_schema=False)
def index(request: Request) -> HTMLResponse:
    docs_url = request.app.docs_url
    docs_link = f'<a href="{docs_url.lstrip("/")}">{docs_url}</a> · ' if docs_url else ""
    page = _read_asset("index.html").replace(DOCS_LINK_SLOT, docs_link)
    return HTMLResponse(page, headers={"Cache-Control": "no-cache"})


@router.get("/web/{name}", include_in_schema=False)
def asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail=f"no web asset {name!r}")
    media_type = _MEDIA_TYPES[name[name.rindex("."):]]
    return Response(_read_asset(name), media_type=media_type, headers={"Cache-Control": "no-cache"})

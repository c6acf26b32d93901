"""``capwatch advise``: the advice of a running capwatch service, as a table or JSON."""

from __future__ import annotations

import argparse
import os

from capwatch.arguments import positive_seconds


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "advise", help="print the cap advice of a running service",
        description="Ask a running `capwatch serve` what to set the per-rank cap to, for one EP group or all.")
    parser.add_argument("--url", default=os.environ.get("CAPWATCH_URL", "http://127.0.0.1:8321"),
                        help="the service's base URL (default $CAPWATCH_URL or http://127.0.0.1:8321)")
    parser.add_argument("--cluster", help="one EP group (default: every cluster the service knows)")
    parser.add_argument("--role", default="target", choices=("target", "draft"), help="which dispatcher")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, help="seconds to wait for the service")
    parser.set_defaults(run=run)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def fetch_advice(url: str, cluster: str | None, role: str, timeout: float) -> list[dict]:
    import httpx

    from capwatch.cli import CommandError

    base = url.rstrip("/")
    parts = httpx.URL(base) if base.startswith(("http://", "https://")) else None
    if parts is None or not parts.host:
        raise CommandError(f"--url {url!r} is not an http(s) URL with a host, like http://127.0.0.1:8321")
    try:
        with httpx.Client(base_url=base, timeout=timeout) as client:
            if cluster is None:
                listing = client.get("/v1/clusters")
                listing.raise_for_status()
                names = [summary["cluster"] for summary in listing.json()]
                if not names:
                    raise CommandError(f"the service at {base} knows no cluster yet: no rank has reported")
            else:
                names = [cluster]
            results = []
            for name in names:
                response = client.get(f"/v1/clusters/{name}/advice", params={"role": role})
                if response.status_code == 404:
                    raise CommandError(response.json().get("detail", f"unknown cluster {name!r}"))
                if response.status_code == 422:
                    raise CommandError(f"{name!r} is not a valid cluster name (letters, digits, _ . : -)")
                response.raise_for_status()
                results.append(response.json())
            return results
    except httpx.TransportError as error:
        raise CommandError(f"cannot reach the capwatch service at {base} ({error}); start it with "
                           "`capwatch serve` or pass --url") from None
    except httpx.HTTPStatusError as error:
        raise CommandError(f"the service at {base} answered {error.response.status_code}: "
                           f"{error.response.text[:200]}") from None


def render(advices: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="capwatch advice: SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK")
    for column in ("cluster", "action", "current", "recommended", "bounds", "confidence", "overflow now -> after",
                   "workspace/rank now -> after", "group change"):
        table.add_column(column, justify="left" if column in ("cluster", "action") else "right")
    for advice in advices:
        bounds = "-" if advice["lower_bound"] is None else f"[{advice['lower_bound']}, {advice['upper_bound']}]"
        delta = advice["workspace_bytes_group_delta"]
        table.add_row(
            advice["cluster"], advice["action"], str(advice["current_cap"]),
            "-" if advice["recommended_cap"] is None else str(advice["recommended_cap"]), bounds,
            f"{advice['confidence']:.2f}",
            f"{_rate(advice['predicted_overflow_rate_current'])} -> {_rate(advice['predicted_overflow_rate_recommended'])}",
            f"{_gib(advice['workspace_bytes_per_rank_current'])} -> {_gib(advice['workspace_bytes_per_rank_recommended'])}",
            "-" if delta is None else f"{'+' if delta >= 0 else '-'}{_gib(abs(delta))}")
    console.print(table)
    for advice in advices:
        console.print(f"[bold]{advice['cluster']}[/bold]: {advice['env'] or 'no change suggested yet'}")
        for reason in advice["reasons"]:
            console.print(f"  - {reason}", highlight=False)


def run(args: argparse.Namespace) -> int:
    import json

    advices = fetch_advice(args.url, args.cluster, args.role, args.timeout)
    if args.json:
        print(json.dumps(advices[0] if args.cluster else advices, indent=2))
    else:
        render(advices)
    return 0

"""``capwatch advise``: the advice of a running capwatch service, or of SGLang logs (``--sglang-log``),
as a table or JSON (the same object ``GET /v1/clusters/{cluster}/advice`` answers)."""

from __future__ import annotations

import argparse
import os

from capwatch.arguments import checked, positive_seconds
from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.caps import MAX_CAP_TOKENS
from capwatch.usage_errors import CommandError
from capwatch.vocabulary import ROLES

cap_tokens = checked(int, lambda value: 1 <= value <= MAX_CAP_TOKENS, f"a cap in 1..{MAX_CAP_TOKENS} tokens")
PROGRESS_MIN_BYTES = 16 << 20  # a progress bar from this much log on


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "advise", help="print the cap advice of a running service",
        description="Ask a running `capwatch serve` what to set the per-rank cap to, for one EP group or all; "
                    "or, with --sglang-log, advise from an SGLang server's own logs (no service, no plugin).")
    parser.add_argument("--url", default=os.environ.get("CAPWATCH_URL", "http://127.0.0.1:8321"),
                        help="the service's base URL (default $CAPWATCH_URL or http://127.0.0.1:8321)")
    parser.add_argument("--cluster", help="one EP group (default: every cluster the service knows)")
    parser.add_argument("--role", default="target", choices=ROLES, help="which dispatcher")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, help="seconds to wait for the service")
    parser.add_argument("--whatif", nargs="+", type=cap_tokens, metavar="CAP",
                        help="instead of the advice, price these caps: predicted overflowing windows per day (with "
                             "its band), workspace bytes, KV-cache tokens (the /whatif curve)")
    offline = parser.add_argument_group("advice from SGLang logs (instead of a service)")
    offline.add_argument("--sglang-log", nargs="+", metavar="FILE",
                         help="SGLang server log(s), plain or .gz, oldest first (e.g. rotated server.log.2 server.log.1 "
                              "server.log); the service's advisor and policy (CAPWATCH_ADVISOR__*) read them; --cluster names "
                              "the advice (default: the first file's name)")
    offline.add_argument("--cap", type=cap_tokens, help="the cap the server runs with (default: what the log's overflow "
                                                         "assertions show, else SGLang's default rule)")
    offline.add_argument("--model", help="model preset that prices the workspace (default: the log's model_path)")
    parser.set_defaults(run=run)


def _gib(value: int | None) -> str:
    return "-" if value is None else format_gib(value)


def _per_day(value: float | None, high: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2g}" + ("" if high is None else f" (<= {high:.2g})")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def service_error(base: str, error: Exception) -> Exception:
    """One line for what went wrong talking to the service: unreachable, or an unexpected answer."""
    import httpx

    if isinstance(error, httpx.HTTPStatusError):
        return CommandError(f"the service at {base} answered {error.response.status_code}: "
                            f"{error.response.text[:200]}")
    return CommandError(f"cannot reach the capwatch service at {base} ({error}); start it with "
                        "`capwatch serve` or pass --url")


def fetch_advice(url: str, cluster: str | None, role: str, timeout: float) -> list[dict]:
    import httpx

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
                if response.status_code == 409:  # this group cannot be advised; the others still can
                    detail = str(response.json().get("detail", response.text))[:300]
                    if cluster is not None:
                        raise CommandError(detail)
                    results.append({"cluster": name, "role": role, "error": detail})
                    continue
                response.raise_for_status()
                results.append(response.json())
            return results
    except httpx.HTTPError as error:
        raise service_error(base, error) from None


def render(advices: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="capwatch advice: SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK")
    for column in ("cluster", "action", "current", "recommended", "bounds", "confidence", "overflow now -> after",
                   "overflow windows/day", "workspace/rank now -> after", "group change"):
        table.add_column(column, justify="left" if column in ("cluster", "action") else "right")
    unavailable = [advice for advice in advices if "error" in advice]
    advices = [advice for advice in advices if "error" not in advice]
    for advice in advices:
        bounds = "-" if advice["lower_bound"] is None else f"[{advice['lower_bound']}, {advice['upper_bound']}]"
        delta = advice["workspace_bytes_group_delta"]
        table.add_row(
            advice["cluster"], advice["action"], str(advice["current_cap"]),
            "-" if advice["recommended_cap"] is None else str(advice["recommended_cap"]), bounds,
            f"{advice['confidence']:.2f}",
            f"{_rate(advice['predicted_overflow_rate_current'])} -> {_rate(advice['predicted_overflow_rate_recommended'])}",
            _per_day(advice.get("predicted_overflow_windows_per_day_recommended"),
                     advice.get("predicted_overflow_windows_per_day_recommended_high")),
            f"{_gib(advice['workspace_bytes_per_rank_current'])} -> {_gib(advice['workspace_bytes_per_rank_recommended'])}",
            "-" if delta is None else f"{'+' if delta >= 0 else '-'}{_gib(abs(delta))}")
    console.print(table)
    for advice in advices:
        console.print(f"[bold]{advice['cluster']}[/bold]: {advice['env'] or 'no change suggested yet'}")
        for reason in advice["reasons"]:
            console.print(f"  - {reason}", highlight=False)
    for advice in unavailable:
        console.print(f"[bold]{advice['cluster']}[/bold]: cannot be advised: {advice['error']}", highlight=False)


def advise_from_logs(paths: list[str], cap: int | None, model: str | None, cluster: str | None,
                     whatif: list[int] | None = None) -> dict | list[dict]:
    import os
    import sys
    import zlib

    for path in paths:
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise CommandError(f"--sglang-log {path!r} is not a readable file")
    try:
        from capwatch.sglang_logs.advise import LogError, advise_from_sglang_logs
    except ImportError as error:
        raise CommandError(f"advice from logs needs {error.name}, which this install lacks: "
                           "pip install --force-reinstall a2a-capwatch") from None
    total = sum(os.path.getsize(path) for path in paths)
    try:
        if sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            with Progress("reading SGLang logs", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                          console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("read", total=total)
                result = advise_from_sglang_logs(paths, cap=cap, model=model, cluster=cluster,
                                                 progress=lambda done: bar.update(task, completed=done))
        else:
            result = advise_from_sglang_logs(paths, cap=cap, model=model, cluster=cluster)
    except LogError as error:
        raise CommandError(str(error)) from None
    except (OSError, EOFError, zlib.error) as error:  # a truncated or corrupt .gz raises the latter two
        raise CommandError(f"cannot read the log: {error or type(error).__name__}; is the file complete?") from None
    if whatif:
        return [row.model_dump(mode="json") for row in result.whatif(whatif)]
    return result.advice.model_dump(mode="json")


def fetch_whatif(url: str, cluster: str | None, role: str, caps: list[int], timeout: float) -> list[dict]:
    import httpx

    if cluster is None:
        raise CommandError("--whatif asks about one EP group: pass --cluster NAME")
    base = url.rstrip("/")
    try:
        with httpx.Client(base_url=base, timeout=timeout) as client:
            response = client.get(f"/v1/clusters/{cluster}/whatif", params={"role": role, "cap": caps})
            if response.status_code in (404, 409, 422):
                raise CommandError(str(response.json().get("detail", response.text))[:300])
            response.raise_for_status()
            return response.json()
    except httpx.HTTPError as error:
        raise service_error(base, error) from None


def render_whatif(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="capwatch what-if: predicted overflows and cost per cap")
    for column in ("cap", "overflow windows/day", "band", "workspace/rank", "group change", "KV tokens/rank freed",
                   "below floor"):
        table.add_column(column, justify="right")
    for row in rows:
        per_day = row.get("predicted_overflow_windows_per_day")
        low, high = row.get("predicted_overflow_windows_per_day_low"), row.get("predicted_overflow_windows_per_day_high")
        delta = row["workspace_bytes_group_delta"]
        freed = row.get("kv_cache_tokens_per_rank_freed")
        table.add_row(str(row["cap"]), "-" if per_day is None else f"{per_day:.3g}",
                      "-" if low is None else f"{low:.3g}..{high:.3g}", _gib(row["workspace_bytes_per_rank"]),
                      f"{'+' if delta >= 0 else '-'}{_gib(abs(delta))}", "-" if freed is None else f"{freed:,}",
                      "yes" if row["below_floor"] else "no")
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    import json

    if args.sglang_log:
        answer = advise_from_logs(args.sglang_log, args.cap, args.model, args.cluster, args.whatif)
        if args.json:
            print(json.dumps(answer, indent=2))
        elif args.whatif:
            render_whatif(answer)
        else:
            render([answer])
        return 0
    if args.cap is not None or args.model is not None:
        raise CommandError("--cap and --model go with --sglang-log (a service knows its ranks' cap and model)")
    if args.whatif:
        rows = fetch_whatif(args.url, args.cluster, args.role, args.whatif, args.timeout)
        print(json.dumps(rows, indent=2)) if args.json else render_whatif(rows)
        return 0
    advices = fetch_advice(args.url, args.cluster, args.role, args.timeout)
    if args.json:
        print(json.dumps(advices[0] if args.cluster else advices, indent=2))
    else:
        render(advices)
    return 0

"""``capwatch advise``: the advice of a running capwatch service, or of an engine's logs (``--sglang-log``: each
engine's log reader adds its own options, ``capwatch.engines``), as a table, JSON Lines (each the object
``GET /v1/clusters/{cluster}/advice`` answers) or CSV."""

from __future__ import annotations

import argparse
import importlib
import os
from functools import cache

from capwatch.arguments import checked, wait_seconds
from capwatch.engines import ENGINES
from capwatch.output_format import add_format_arguments
from capwatch.service_client import fetch_advice, response_detail, service_client, service_error
from capwatch.sizing.caps import MAX_CAP_TOKENS
from capwatch.sizing.checks import MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS
from capwatch.usage_errors import CommandError
from capwatch.vocabulary import ROLES

cap_tokens = checked(int, lambda value: 1 <= value <= MAX_CAP_TOKENS, f"a cap in 1..{MAX_CAP_TOKENS} tokens")
hidden_size = checked(int, lambda value: 1 <= value <= MAX_HIDDEN_SIZE, f"a hidden size in 1..{MAX_HIDDEN_SIZE}")
top_k = checked(int, lambda value: 1 <= value <= MAX_NUM_EXPERTS, f"routed experts per token in 1..{MAX_NUM_EXPERTS}")
num_experts = checked(int, lambda value: 1 <= value <= MAX_NUM_EXPERTS, f"a number of experts in 1..{MAX_NUM_EXPERTS}")
tokens_per_request = checked(int, lambda value: 1 <= value <= 1024, "tokens per request per step in 1..1024")
ep_size = checked(int, lambda value: 1 <= value <= 1 << 16, "an EP group size in 1..65536")
# The numeric flags a log reader's option group takes (by dest), converted and checked here.
FLAG_TYPES = {"cap": cap_tokens, "hidden_size": hidden_size, "top_k": top_k, "num_experts": num_experts,
              "tokens_per_request": tokens_per_request, "ep_size": ep_size}
PROGRESS_MIN_BYTES = 16 << 20  # a progress bar from this much log on


@cache
def log_readers() -> tuple:
    """Each engine's offline log reader (its ``LOG_READER`` module: options, checks, the reader)."""
    return tuple(importlib.import_module(engine.LOG_READER) for engine in ENGINES.values() if engine.LOG_READER)


def register(subparsers: argparse._SubParsersAction) -> None:
    alternatives = "".join(f"; or, {reader.ALTERNATIVE}" for reader in log_readers())
    parser = subparsers.add_parser(
        "advise", help="print the cap advice of a running service",
        description="Ask a running `capwatch serve` what to set the per-rank cap to, for one EP group or all"
                    f"{alternatives}.")
    parser.add_argument("--url", default=os.environ.get("CAPWATCH_URL", "http://127.0.0.1:8321"),
                        help="the service's base URL (default $CAPWATCH_URL or http://127.0.0.1:8321)")
    parser.add_argument("--cluster", help="one EP group (default: every cluster the service knows)")
    parser.add_argument("--role", default="target", choices=ROLES, help="which dispatcher")
    add_format_arguments(parser)
    parser.add_argument("--timeout", type=wait_seconds, default=10.0,
                        help="seconds to wait for the service, 0.1..3600 (default 10)")
    parser.add_argument("--whatif", nargs="+", type=cap_tokens, metavar="CAP",
                        help="instead of the advice, price these caps: predicted overflowing windows per day (with "
                             "its band), workspace bytes, KV-cache tokens (the /whatif curve)")
    for reader in log_readers():
        reader.add_options(parser, FLAG_TYPES)
    parser.set_defaults(run=run)


def advise_from_logs(reader, paths: list[str], flags: dict, cluster: str | None,
                     whatif: list[int] | None = None) -> dict | list[dict]:
    """``reader``: an engine's log reader (``log_readers``); ``flags``: its SERVER_FLAGS given, by name."""
    import sys
    import zlib

    problem = reader.path_problem(paths)
    if problem:
        raise CommandError(problem)
    try:
        advise, log_error = reader.load_reader()
    except ImportError as error:
        raise CommandError(f"advice from logs needs {error.name}, which this install lacks: "
                           "pip install --force-reinstall a2a-capwatch") from None
    total = sum(os.path.getsize(path) for path in paths if path != reader.STDIN and os.path.isfile(path))
    try:
        if sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            with Progress(reader.PROGRESS_LABEL, BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                          console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("read", total=total)
                result = advise(paths, flags, cluster, progress=lambda done: bar.update(task, completed=done))
        else:
            result = advise(paths, flags, cluster)
    except log_error as error:
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
        with service_client(url, timeout) as client:
            response = client.get(f"/v1/clusters/{cluster}/whatif", params={"role": role, "cap": caps})
            if response.status_code in (404, 409, 422):
                raise CommandError(response_detail(response))
            response.raise_for_status()
            return response.json()
    except httpx.HTTPError as error:
        raise service_error(base, error) from None


def run(args: argparse.Namespace) -> int:
    from capwatch.advice_table import print_advice, print_whatif
    from capwatch.output_format import print_objects

    output = args.output or "table"
    for reader in log_readers():
        paths = getattr(args, reader.DEST)
        if not paths:
            continue
        flags = {name: getattr(args, name) for name in reader.SERVER_FLAGS}
        answer = advise_from_logs(reader, paths, flags, args.cluster, args.whatif)
        if output != "table":
            print_objects(answer if args.whatif else [answer], output)
        elif args.whatif:
            print_whatif(answer)
        else:
            print_advice([answer])
        return 0
    for reader in log_readers():
        given = ["--" + name.replace("_", "-") for name in reader.SERVER_FLAGS if getattr(args, name) is not None]
        if given:
            raise CommandError(f"{', '.join(given)} go(es) with {reader.OPTION} (a service knows its ranks' "
                               "configuration)")
    if args.whatif:
        rows = fetch_whatif(args.url, args.cluster, args.role, args.whatif, args.timeout)
        print_objects(rows, output) if output != "table" else print_whatif(rows)
        return 0
    advices = fetch_advice(args.url, args.cluster, args.role, args.timeout)
    if output != "table":
        print_objects(advices, output)
    else:
        print_advice(advices)
    return 0

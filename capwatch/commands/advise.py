"""``capwatch advise``: the advice of a running capwatch service, or of SGLang logs (``--sglang-log``),
as a table, JSON Lines (each the object ``GET /v1/clusters/{cluster}/advice`` answers) or CSV."""

from __future__ import annotations

import argparse
import os

from capwatch.arguments import checked, wait_seconds
from capwatch.backends import SPECS
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
SERVER_FLAGS = ("cap", "model", "hidden_size", "top_k", "num_experts", "tokens_per_request", "ep_size", "a2a_backend")
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
    add_format_arguments(parser)
    parser.add_argument("--timeout", type=wait_seconds, default=10.0,
                        help="seconds to wait for the service, 0.1..3600 (default 10)")
    parser.add_argument("--whatif", nargs="+", type=cap_tokens, metavar="CAP",
                        help="instead of the advice, price these caps: predicted overflowing windows per day (with "
                             "its band), workspace bytes, KV-cache tokens (the /whatif curve)")
    offline = parser.add_argument_group("advice from SGLang logs (instead of a service)")
    offline.add_argument("--sglang-log", nargs="+", metavar="FILE",
                         help="SGLang server log(s), plain or .gz, in any order (- reads standard input, a pipe "
                              "too: kubectl logs POD | capwatch advise --sglang-log -): rotated, per rank or per node, "
                              "merged by time (every SGLang release's format; Docker json-file, CRI, kubectl "
                              "--timestamps, Ray); the advisor and its policy (CAPWATCH_ADVISOR__*, as serve's) read them; "
                              "--cluster names the advice (default: the first file's name)")
    offline.add_argument("--cap", type=cap_tokens, help="the cap the server runs with (default: what the log's "
                                                         "overflow assertions show, else SGLang's default rule)")
    offline.add_argument("--model", help="model preset that prices the workspace (default: the log's model_path)")
    offline.add_argument("--hidden-size", type=hidden_size, metavar="H", help="a custom model: its hidden size ...")
    offline.add_argument("--top-k", type=top_k, metavar="K", help="... its routed experts per token ...")
    offline.add_argument("--num-experts", type=num_experts, metavar="E", help="... and its routed experts")
    offline.add_argument("--tokens-per-request", type=tokens_per_request, metavar="N",
                         help="tokens each request dispatches per decode step (the speculative draft tokens, else 1; "
                              "default: from the log's server_args)")
    offline.add_argument("--ep-size", type=ep_size, metavar="N", help="ranks in the EP group (default: from the log's "
                                                                       "server_args)")
    offline.add_argument("--a2a-backend", choices=sorted(SPECS),
                         help="size this A2A backend's cap (default: the log's moe_a2a_backend)")
    parser.set_defaults(run=run)


STDIN = "-"  # --sglang-log - reads standard input (capwatch.sglang_logs.log_file.STDIN)


def check_log_paths(paths: list[str]) -> None:
    """Each path a readable file or stream (a pipe, /dev/stdin, a process substitution), ``-`` at most once
    and only from a pipe or a file: a terminal on stdin would wait for typing."""
    import stat
    import sys

    if paths.count(STDIN) > 1:
        raise CommandError("--sglang-log names standard input (-) more than once")
    for path in paths:
        if path == STDIN:
            if sys.stdin is None or sys.stdin.isatty():
                raise CommandError("--sglang-log - reads the log from standard input, which is a terminal: pipe the "
                                   "log in (kubectl logs POD | capwatch advise --sglang-log -)")
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            raise CommandError(f"--sglang-log {path!r} is not a readable file ({error.strerror})") from None
        readable = stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)
        if stat.S_ISDIR(mode) or not readable or not os.access(path, os.R_OK):
            raise CommandError(f"--sglang-log {path!r} is not a readable file or stream"
                               + (" (a directory: name its log files)" if stat.S_ISDIR(mode) else ""))


def advise_from_logs(paths: list[str], flags: dict, cluster: str | None,
                     whatif: list[int] | None = None) -> dict | list[dict]:
    """``flags``: the SERVER_FLAGS given, by name."""
    import os
    import sys
    import zlib

    check_log_paths(paths)
    try:
        from capwatch.sglang_logs.advise import LogError, ServerFlags, advise_from_sglang_logs
    except ImportError as error:
        raise CommandError(f"advice from logs needs {error.name}, which this install lacks: "
                           "pip install --force-reinstall a2a-capwatch") from None
    total = sum(os.path.getsize(path) for path in paths if path != STDIN and os.path.isfile(path))
    try:
        server = ServerFlags(**flags)
        if sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            with Progress("reading SGLang logs", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                          console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("read", total=total)
                result = advise_from_sglang_logs(paths, server, cluster=cluster,
                                                 progress=lambda done: bar.update(task, completed=done))
        else:
            result = advise_from_sglang_logs(paths, server, cluster=cluster)
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
    if args.sglang_log:
        flags = {name: getattr(args, name) for name in SERVER_FLAGS}
        answer = advise_from_logs(args.sglang_log, flags, args.cluster, args.whatif)
        if output != "table":
            print_objects(answer if args.whatif else [answer], output)
        elif args.whatif:
            print_whatif(answer)
        else:
            print_advice([answer])
        return 0
    given = ["--" + name.replace("_", "-") for name in SERVER_FLAGS if getattr(args, name) is not None]
    if given:
        raise CommandError(f"{', '.join(given)} go(es) with --sglang-log (a service knows its ranks' configuration)")
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

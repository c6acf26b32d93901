"""The log reader's part of ``capwatch advise`` (``capwatch/commands/advise.py`` adds each engine's, found through
``capwatch.engines``): its option group (``--sglang-log`` and the flags that stand in for what a log does not say),
the check of the files it is given, and the reader itself, imported only when a log is read.

Light on purpose: the command line builds its parser from this module on every run."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Mapping

from capwatch.backends import SPECS

OPTION = "--sglang-log"
DEST = "sglang_log"  # where argparse keeps OPTION's files
# The server flags the option group adds (their ``dest``): they go with OPTION only.
SERVER_FLAGS = ("cap", "model", "hidden_size", "top_k", "num_experts", "tokens_per_request", "ep_size", "a2a_backend")
# What the command's description says the option does, after "or, ".
ALTERNATIVE = "with --sglang-log, advise from an SGLang server's own logs (no service, no plugin)"
PROGRESS_LABEL = "reading SGLang logs"  # the progress bar of a large log, on a terminal
STDIN = "-"  # --sglang-log - reads standard input (capwatch.sglang_logs.log_file.STDIN)


def add_options(parser: argparse.ArgumentParser, types: Mapping[str, Callable[[str], int]]) -> None:
    """The option group; ``types``: the command's converter of each numeric server flag, by ``dest`` (a bad value
    gets the command line's one-line error)."""
    offline = parser.add_argument_group("advice from SGLang logs (instead of a service)")
    offline.add_argument(OPTION, dest=DEST, nargs="+", metavar="FILE",
                         help="SGLang server log(s), plain or .gz, in any order (- reads standard input, a pipe "
                              "too: kubectl logs POD | capwatch advise --sglang-log -): rotated, per rank or per node, "
                              "merged by time (every SGLang release's format; Docker json-file, CRI, kubectl "
                              "--timestamps, Ray); the advisor and its policy (CAPWATCH_ADVISOR__*, as serve's) read "
                              "them; --cluster names the advice (default: the first file's name)")
    offline.add_argument("--cap", type=types["cap"], help="the cap the server runs with (default: what the log's "
                                                           "overflow assertions show, else SGLang's default rule)")
    offline.add_argument("--model", help="model preset that prices the workspace (default: the log's model_path)")
    offline.add_argument("--hidden-size", type=types["hidden_size"], metavar="H",
                         help="a custom model: its hidden size ...")
    offline.add_argument("--top-k", type=types["top_k"], metavar="K", help="... its routed experts per token ...")
    offline.add_argument("--num-experts", type=types["num_experts"], metavar="E", help="... and its routed experts")
    offline.add_argument("--tokens-per-request", type=types["tokens_per_request"], metavar="N",
                         help="tokens each request dispatches per decode step (the speculative draft tokens, else 1; "
                              "default: from the log's server_args)")
    offline.add_argument("--ep-size", type=types["ep_size"], metavar="N", help="ranks in the EP group (default: from "
                                                                                "the log's server_args)")
    offline.add_argument("--a2a-backend", choices=sorted(SPECS),
                         help="size this A2A backend's cap (default: the log's moe_a2a_backend)")


def path_problem(paths: list[str]) -> str | None:
    """What is wrong with the files given (None: nothing): each must be a readable file or stream (a pipe,
    /dev/stdin, a process substitution), ``-`` at most once and only from a pipe or a file: a terminal on stdin
    would wait for typing."""
    if paths.count(STDIN) > 1:
        return "--sglang-log names standard input (-) more than once"
    for path in paths:
        if path == STDIN:
            if sys.stdin is None or sys.stdin.isatty():
                return ("--sglang-log - reads the log from standard input, which is a terminal: pipe the "
                        "log in (kubectl logs POD | capwatch advise --sglang-log -)")
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            return f"--sglang-log {path!r} is not a readable file ({error.strerror})"
        readable = stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)
        if stat.S_ISDIR(mode) or not readable or not os.access(path, os.R_OK):
            return (f"--sglang-log {path!r} is not a readable file or stream"
                    + (" (a directory: name its log files)" if stat.S_ISDIR(mode) else ""))
    return None


def load_reader():
    """The reader, imported now (ImportError where this install lacks what it needs): ``(advise, LogError)``,
    ``advise(paths, flags, cluster, progress=None)`` the advice from the logs (``flags``: SERVER_FLAGS' values, by
    name; ``.advice``, ``.whatif(caps)``), raising ``LogError`` where the logs cannot be advised on."""
    from capwatch.sglang_logs.advise import LogError, ServerFlags, advise_from_sglang_logs

    def advise(paths: list[str], flags: dict, cluster: str | None,
               progress: Callable[[int], None] | None = None):
        return advise_from_sglang_logs(paths, ServerFlags(**flags), cluster=cluster, progress=progress)

    return advise, LogError

"""``capwatch demo``: service + N real rank processes + advice, on one machine (no GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capwatch.arguments import checked, hold_seconds, port_or_zero, positive_int
from capwatch.engines import ENGINE
from capwatch.usage_errors import CommandError
from capwatch.vocabulary import OVERFLOW_POLICIES


def register(subparsers) -> None:
    # Cheap: constants only (torch, FastAPI and the service load when the demo runs).
    from capwatch.demo.replay_clock import STEP_INTERVAL_S
    from capwatch.demo.session import (
        DEFAULT_CAP,
        DEFAULT_METRICS_PORT,
        DEFAULT_POLICY,
        DEFAULT_PORT,
        DEFAULT_RANKS,
        DEFAULT_STEPS,
    )
    from capwatch.demo.trace import LIMITS_HELP, MAX_TRACE_STEPS
    from capwatch.demo.workload import DEFAULT_MODEL

    step_count = checked(int, lambda steps: 0 < steps <= MAX_TRACE_STEPS, f"a number of steps in 1..{MAX_TRACE_STEPS}")

    parser = subparsers.add_parser(
        "demo", help="run the service and N rank processes on a decode workload, then show the advice",
        description="Start the capwatch service, launch N ranks (real processes in a torch.distributed gloo group "
                    "running the instrumented dispatcher) on a realistic decode workload or a trace, with exporters "
                    "and reporters on; end with the advice and the URLs of the web page, the API and the metrics.")
    parser.add_argument("--trace", type=Path, metavar="FILE",
                        help='replay JSON Lines, one step a line: {"tokens": [rank0, rank1, ...], "t": seconds} '
                             f"(t optional: without it, one step every {STEP_INTERVAL_S * 1000:g} ms, on the replay's "
                             f"own clock); the number of ranks follows the trace ({LIMITS_HELP})")
    parser.add_argument("--cap", type=positive_int, default=DEFAULT_CAP,
                        help=f"per-rank token cap the ranks run with (default: {DEFAULT_CAP}, {ENGINE.TITLE}'s default)")
    parser.add_argument("--ranks", type=positive_int,
                        help=f"EP ranks to launch (default: {DEFAULT_RANKS}, or the trace's)")
    parser.add_argument("--steps", type=step_count,
                        help=f"decode steps, at most {MAX_TRACE_STEPS:,} (default: {DEFAULT_STEPS} generated; with "
                             "--trace, the first N steps)")
    parser.add_argument("--overflow-policy", choices=OVERFLOW_POLICIES, default=DEFAULT_POLICY,
                        help="past the cap: raise ends the demo with the dispatcher's error (exit 1); chunk splits "
                             f"the dispatch into rounds (default: {DEFAULT_POLICY})")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"model preset for routing and workspace pricing (default: {DEFAULT_MODEL})")
    parser.add_argument("--cluster", default="demo", help="cluster name the ranks report under (default: demo)")
    parser.add_argument("--json", action="store_true",
                        help="print only the final advice object (as GET /v1/clusters/{cluster}/advice returns it)")
    parser.add_argument("--port", type=port_or_zero,
                        help=f"service port on 127.0.0.1 (default: {DEFAULT_PORT}, or a free one; 0: a free one)")
    parser.add_argument("--metrics-port", type=port_or_zero, metavar="B",
                        help=f"rank r exports /metrics on B + r (default: {DEFAULT_METRICS_PORT}, or the next free "
                             "block; 0: any free block)")
    parser.add_argument("--hold", type=hold_seconds, default=0.0, metavar="SECONDS",
                        help="keep the service and the exporters up this long after the run")
    parser.add_argument("--service-url", metavar="URL",
                        help="report to this running service instead of starting one (export CAPWATCH_TOKEN "
                             "when it requires a bearer token)")
    parser.add_argument("--state-dir", type=Path, metavar="DIR",
                        help="a writable folder (created if missing) where the embedded service keeps its SQLite "
                             "database and log (default: $XDG_STATE_HOME/capwatch or ~/.local/state/capwatch)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workload (default: 0)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from capwatch.extras import require_extra

    require_extra("demo", "demo")  # before the state folder is created or anything starts
    from capwatch.backends import DEFAULT_BACKEND
    from capwatch.demo.session import DemoOptions, run_demo
    from capwatch.demo.trace import MAX_DEMO_RANKS
    from capwatch.telemetry.report import MAX_CAP_TOKENS, RankIdentity

    if args.cap > MAX_CAP_TOKENS:
        raise CommandError(f"--cap {args.cap} exceeds {MAX_CAP_TOKENS} tokens per rank")
    if args.ranks is not None and args.ranks > MAX_DEMO_RANKS:
        raise CommandError(f"--ranks {args.ranks}: the {DEFAULT_BACKEND.name} A2A the demo runs supports at most "
                           f"{MAX_DEMO_RANKS} ranks")
    if args.service_url and args.port is not None:
        raise CommandError("--port starts a service; --service-url reports to a running one: pass only one")
    if args.service_url and not args.service_url.startswith(("http://", "https://")):
        raise CommandError(f"--service-url {args.service_url!r} must look like http://host:port")
    try:
        RankIdentity.model_validate(dict(cluster=args.cluster, ep_rank=0, ep_size=1, boot_id="x"))
    except ValueError:
        raise CommandError(f"--cluster {args.cluster!r}: use 1-128 letters, digits and . _ : -") from None
    options = DemoOptions(
        trace=args.trace, cap=args.cap, ranks=args.ranks, steps=args.steps, overflow_policy=args.overflow_policy,
        model=args.model, cluster=args.cluster, json=args.json, port=args.port, metrics_port=args.metrics_port,
        hold_s=args.hold, service_url=args.service_url, state_dir=args.state_dir, seed=args.seed,
    )
    return run_demo(options)

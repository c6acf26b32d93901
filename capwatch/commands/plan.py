"""``capwatch plan``: what a per-rank dispatch cap costs in FlashInfer MoE A2A workspace.

Registration is cheap; sizing, rich and json load only when the command runs.
"""

from __future__ import annotations

import argparse

from capwatch.sizing.checks import MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS

# Plain constants (no sizing work at import): the limits --help states.
from capwatch.sizing.flashinfer_one_sided import LAMPORT_MAX_TOKENS_PER_RANK
from capwatch.sizing.flashinfer_releases import MAX_EP_SIZE

DESCRIPTION = """\
Price the per-rank dispatch cap (SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK) in FlashInfer
MoE all-to-all workspace bytes, byte-exact for every flashinfer release that has the A2A.

Caps: --cap N, repeatable; a comma list (--cap 1024,2048); an inclusive range START:STOP[:STEP]
(--cap 256:4096:256; STEP defaults to 128). Or --budget SIZE for the largest 128-aligned cap whose
per-rank workspace fits (units: bytes, KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. 2GiB, 512MiB).

Modes: flashinfer = FlashInfer's formula for the payload format; sglang = what SGLang allocates
(bf16 floor on dispatch bytes, +128 B with --draft); sglang-legacy = SGLang before PR #25907
(cap x ep_size passed as max_num_tokens, an ep_size-fold over-allocation).
"""

MAX_CAPS = 4096  # rows one invocation prints; a range beyond this is almost surely a typo
MAX_NUMBER_CHARACTERS = 32  # longer than any value the limits in --help allow: refused before parsing


def _shown(text) -> str:
    """A value as a message quotes it: a 5,000-digit mistake stays a one-line message."""
    text = str(text)
    return repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text)} characters)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="price per-rank dispatch caps in A2A workspace bytes",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Values are read as text and checked in run(), so every mistake is one clear line + exit 2.
    geometry = parser.add_argument_group("model geometry (a preset, or all three numbers)")
    geometry.add_argument("--model", metavar="NAME", help="preset, case-insensitive, e.g. deepseek-v3, kimi-k2")
    geometry.add_argument("--hidden-size", metavar="H", help=f"hidden size of the tokens dispatched (1..{MAX_HIDDEN_SIZE})")
    geometry.add_argument("--top-k", metavar="K", help="routed experts per token (1..kMaxTopK of the release: 8 before "
                                                       "0.6.8, 22 after)")
    geometry.add_argument("--num-experts", metavar="E", help=f"routed experts in the model (top-k..{MAX_NUM_EXPERTS})")
    parser.add_argument("--ep-size", metavar="N", help=f"ranks in the expert-parallel group (1..{MAX_EP_SIZE}; 256 "
                                                       "on 0.7.4)")
    parser.add_argument("--cap", metavar="CAPS", action="append",
                        help=f"per-rank cap(s): N, N,M,... or START:STOP[:STEP] (repeatable; 1..2^31-1, at most "
                             f"{MAX_CAPS} caps)")
    parser.add_argument("--budget", metavar="SIZE", help="per-rank workspace budget, e.g. 2GiB (at most "
                                                         f"{MAX_NUMBER_CHARACTERS} characters)")
    parser.add_argument("--format", dest="payload_format", metavar="FORMAT", default="bf16",
                        help="dispatch payload: bf16, fp16, fp8, nvfp4, mxfp8, mxfp4, deepseek-fp8 (default bf16)")
    parser.add_argument("--eplb-stats-experts", metavar="S", default="0",
                        help="experts in FlashInfer's EPLB stats region (0.6.16+; 0..num_experts; default 0)")
    parser.add_argument("--flashinfer-version", metavar="X.Y.Z", default=None,
                        help="flashinfer-python release (default 0.7.2.post1, the newest with MoeAlltoAll; "
                             "0.7.4 sizes NVLinkOneSidedAlltoAll)")
    parser.add_argument("--mode", default="flashinfer", metavar="MODE",
                        help="flashinfer (default), sglang or sglang-legacy")
    parser.add_argument("--draft", action="store_true", help="size SGLang's speculative draft dispatcher (+128 B)")
    parser.add_argument("--lamport-tokens", metavar="T", default="0",
                        help=f"0.7.4 only: Lamport transport token limit the run settles on (0..{LAMPORT_MAX_TOKENS_PER_RANK}; "
                             "default 0 = off)")
    parser.add_argument("--json", action="store_true", help="JSON: one object per cap, a list for several")
    parser.set_defaults(run=run)


def _integer(flag: str, text: str, minimum: int = 1) -> int:
    from capwatch.sizing.checks import SizingError

    digits = str(text).strip().replace("_", "")
    if len(digits) > MAX_NUMBER_CHARACTERS:
        raise SizingError(f"{flag} {_shown(text)} is far beyond its limit (see capwatch plan --help)")
    try:
        value = int(digits)
    except ValueError:
        raise SizingError(f"{flag} must be an integer, got {_shown(text)}") from None
    if value < minimum:
        raise SizingError(f"{flag} must be {'positive' if minimum == 1 else f'>= {minimum}'}, got {value}")
    return value


def parse_caps(values: list[str]) -> list[int]:
    """``["1024", "2048,4096", "256:1024:256"]`` -> caps in the order given, duplicates dropped."""
    from capwatch.sizing.checks import SizingError

    caps: list[int] = []
    for value in values:
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                raise SizingError(f"--cap {value!r} has an empty entry")
            if ":" in item:
                parts = item.split(":")
                if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
                    raise SizingError(f"--cap range {item!r} must be START:STOP or START:STOP:STEP")
                start, stop = (_integer(f"--cap range {item!r} bound", p) for p in parts[:2])
                step = _integer(f"--cap range {item!r} step", parts[2]) if len(parts) == 3 else 128
                if start > stop:
                    raise SizingError(f"--cap range {item!r} runs backwards: START must be <= STOP")
                if (stop - start) // step + 1 + len(caps) > MAX_CAPS:
                    raise SizingError(f"--cap asks for more than {MAX_CAPS} caps; use a larger STEP")
                caps.extend(range(start, stop + 1, step))
            else:
                caps.append(_integer("--cap", item))
            if len(caps) > MAX_CAPS:
                raise SizingError(f"--cap asks for more than {MAX_CAPS} caps")
    return list(dict.fromkeys(caps))


def _geometry(args: argparse.Namespace):
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.model_presets import custom_geometry, model_geometry

    custom = {"--hidden-size": args.hidden_size, "--top-k": args.top_k, "--num-experts": args.num_experts}
    given = [flag for flag, value in custom.items() if value is not None]
    if args.model is not None:
        if given:
            raise SizingError(f"give either --model or {', '.join(custom)}, not both ({', '.join(given)} with --model)")
        return model_geometry(args.model)
    if not given:
        raise SizingError("give --model NAME, or --hidden-size, --top-k and --num-experts")
    missing = [flag for flag, value in custom.items() if value is None]
    if missing:
        raise SizingError(f"custom geometry needs {', '.join(missing)} too")
    return custom_geometry(*(_integer(flag, value) for flag, value in custom.items()))


def run(args: argparse.Namespace) -> int:
    import json

    from capwatch.sizing.byte_units import parse_byte_size
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.plan import MODES, largest_plan_within, plan_workspace

    if (args.cap is None) == (args.budget is None):
        raise SizingError("give --cap (one or more caps) or --budget SIZE, exactly one of them")
    if args.mode not in MODES:
        raise SizingError(f"unknown --mode {args.mode!r}; choose one of {', '.join(MODES)}")
    if args.ep_size is None:
        raise SizingError("give --ep-size N, the ranks in the expert-parallel group")
    geometry = _geometry(args)
    options = dict(
        geometry=geometry, ep_size=_integer("--ep-size", args.ep_size),
        payload_format=args.payload_format.strip().lower(),
        eplb_stats_num_experts=_integer("--eplb-stats-experts", args.eplb_stats_experts, 0),
        flashinfer_version=args.flashinfer_version, mode=args.mode, draft=args.draft,
        lamport_max_tokens=_integer("--lamport-tokens", args.lamport_tokens, 0),
    )
    if args.budget is not None:
        if len(args.budget.strip()) > MAX_NUMBER_CHARACTERS:
            raise SizingError(f"--budget {_shown(args.budget)} is not a size like 2GiB or 512MiB")
        budget = parse_byte_size(args.budget)
        best = largest_plan_within(budget, **options)
        try:  # the next aligned cap, to show it does not fit
            above = plan_workspace(**{**options, "cap": best.cap + 128})
        except SizingError:  # past FlashInfer's int32 token count
            above = None
        if args.json:
            print(json.dumps({**best.as_dict(), "budget_bytes": budget,
                              "next_cap": above.cap if above else None,
                              "next_cap_workspace_bytes_per_rank": above.workspace_bytes_per_rank if above else None},
                             indent=2))
        else:
            _print_table([best] + ([above] if above else []), geometry,
                         title_note=f"budget {args.budget} = {budget:,} B per rank", budget=budget)
        return 0

    plans = [plan_workspace(cap=cap, **options) for cap in parse_caps(args.cap)]
    if args.json:
        payload = plans[0].as_dict() if len(plans) == 1 else [plan.as_dict() for plan in plans]
        print(json.dumps(payload, indent=2))
    else:
        _print_table(plans, geometry)
    return 0


def _print_table(plans, geometry, title_note: str = "", budget: int | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from capwatch.sizing.byte_units import format_bytes

    first = plans[0]
    console = Console()
    console.width = max(console.width, 150)  # piped output defaults to 80 columns and would wrap
    title = (f"{geometry.name}: H={geometry.hidden_size}, top-k={geometry.top_k}, E={geometry.num_experts} | "
             f"ep_size={first.ep_size}, {first.payload_format}, flashinfer {first.flashinfer_version} "
             f"({first.layout}), mode {first.mode}{', draft' if first.draft else ''}"
             + (f", EPLB stats {first.eplb_stats_num_experts}" if first.eplb_stats_num_experts else ""))
    table = Table(title=title, caption=title_note or None)
    for header in ("cap/rank", "max_num_tokens", "dispatch B/tok", "combine B/tok", "aux",
                   "workspace/rank", "bytes/rank", "EP group", "expert rows"):
        table.add_column(header, justify="right")
    show_lamport = any(plan.lamport_bytes for plan in plans)
    if show_lamport:
        table.add_column("of which Lamport", justify="right")
    if budget is not None:
        table.add_column("fits", justify="center")
    for plan in plans:
        row = [f"{plan.cap:,}", f"{plan.max_num_tokens:,}", f"{plan.dispatch_bytes_per_token:,}",
               f"{plan.combine_bytes_per_token:,}", format_bytes(plan.aux_bytes),
               format_bytes(plan.workspace_bytes_per_rank), f"{plan.workspace_bytes_per_rank:,}",
               format_bytes(plan.workspace_bytes_group), f"{plan.expert_rows:,}"]
        if show_lamport:
            row.append(format_bytes(plan.lamport_bytes))
        if budget is not None:
            row.append("yes" if plan.workspace_bytes_per_rank <= budget else "no")
        table.add_row(*row)
    console.print(table)
    if budget is not None:
        from capwatch.sizing.backends import FLASHINFER

        at_limit = first.cap == FLASHINFER.max_cap_tokens
        console.print(f"largest 128-aligned cap within budget: {first.cap}" +
                      (" (the largest cap capwatch sizes; the budget holds more)" if at_limit else ""))

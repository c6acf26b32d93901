"""``capwatch plan``: what a per-rank dispatch cap costs in A2A memory, by the backend's planner (its spec in
``capwatch.backends``): the default backend's, or ``--backend NAME``'s.

Registration is cheap; sizing, rich and json load only when the command runs.
"""

from __future__ import annotations

import argparse

from capwatch.backends import DEFAULT_BACKEND, SPECS
from capwatch.sizing.checks import MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS

CAPS_HELP = """\
Caps: --cap N, repeatable; a comma list (--cap 1024,2048); an inclusive range START:STOP[:STEP]
(--cap 256:4096:256; STEP defaults to 128). Or --budget SIZE for the largest 128-aligned cap whose
per-rank workspace fits (units: bytes, KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. 2GiB, 512MiB).

Output: --format table (default), json (one object per cap or budget answer, a line each) or csv;
--json = --format json. A payload format given to --format (--format nvfp4) is --payload-format."""
# The default backend's paragraph, the general ones, then every other backend's.
DESCRIPTION = "\n\n".join([DEFAULT_BACKEND.planner.description, CAPS_HELP, *(
    spec.planner.description for spec in SPECS.values() if spec is not DEFAULT_BACKEND)]) + "\n"

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
    without_top_k = [name for name, spec in SPECS.items() if not spec.planner.top_k_needed]
    geometry = parser.add_argument_group("model geometry (a preset, or all three numbers)")
    geometry.add_argument("--model", metavar="NAME", help="preset, case-insensitive, e.g. deepseek-v3, kimi-k2")
    geometry.add_argument("--hidden-size", metavar="H", help=f"hidden size of the tokens dispatched (1..{MAX_HIDDEN_SIZE})")
    geometry.add_argument("--top-k", metavar="K", help="routed experts per token (1..kMaxTopK of the release: 8 before "
                                                       "0.6.8, 22 after" + "".join(f"; not needed with --backend {name}"
                                                                                   for name in without_top_k) + ")")
    geometry.add_argument("--num-experts", metavar="E", help=f"routed experts in the model (top-k..{MAX_NUM_EXPERTS})")
    limits = "; ".join(spec.planner.ep_size_limit for spec in SPECS.values() if spec.planner.ep_size_limit)
    parser.add_argument("--ep-size", metavar="N", help=f"ranks in the expert-parallel group ({limits})")
    parser.add_argument("--cap", metavar="CAPS", action="append",
                        help=f"per-rank cap(s): N, N,M,... or START:STOP[:STEP] (repeatable; 1..2^31-1, at most "
                             f"{MAX_CAPS} caps)")
    parser.add_argument("--budget", metavar="SIZE", help="per-rank workspace budget, e.g. 2GiB (at most "
                                                         f"{MAX_NUMBER_CHARACTERS} characters)")
    parser.add_argument("--format", dest="format_given", metavar="FORMAT", default=None,
                        help="output: table (default), json (one object per line) or csv; a payload format here "
                             "(--format nvfp4) is read as --payload-format, as before")
    for spec in SPECS.values():  # each backend's own options, in its group if it has one
        planner = spec.planner
        group = parser.add_argument_group(planner.group_title) if planner.group_title else parser
        for option in planner.options:
            if option.metavar is None:
                group.add_argument(option.flag, dest=option.dest, action="store_true", help=option.help)
            else:
                group.add_argument(option.flag, dest=option.dest, metavar=option.metavar, default=None,
                                   help=option.help)
    parser.add_argument("--backend", metavar="NAME", default=DEFAULT_BACKEND.name,
                        help=f"A2A backend, as --moe-a2a-backend names it: {', '.join(SPECS)} "
                             f"(default {DEFAULT_BACKEND.name})")
    parser.add_argument("--json", dest="output", action="store_const", const="json",
                        help="the same as --format json: one object per cap, a line each")
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


def _geometry(args: argparse.Namespace, top_k_needed: bool = True):
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.model_presets import custom_geometry, model_geometry

    custom = {"--hidden-size": args.hidden_size, "--top-k": args.top_k, "--num-experts": args.num_experts,
              "--shared-experts": getattr(args, "shared_experts", None)}
    given = [flag for flag, value in custom.items() if value is not None]
    if args.model is not None:
        if given:
            raise SizingError(f"give either --model or {', '.join(custom)}, not both ({', '.join(given)} with --model)")
        return model_geometry(args.model)
    needed = ["--hidden-size", "--top-k", "--num-experts"] if top_k_needed else ["--hidden-size", "--num-experts"]
    if not given:
        raise SizingError(f"give --model NAME, or {', '.join(needed[:-1])} and {needed[-1]}")
    missing = [flag for flag in needed if custom[flag] is None]
    if missing:
        raise SizingError(f"custom geometry needs {', '.join(missing)} too")
    hidden, experts = _integer("--hidden-size", args.hidden_size), _integer("--num-experts", args.num_experts)
    top_k = _integer("--top-k", args.top_k) if args.top_k is not None else 1  # a planner that does not use it
    shared = _integer("--shared-experts", custom["--shared-experts"], 0) if custom["--shared-experts"] is not None else 0
    return custom_geometry(hidden, top_k, experts, shared)


def _budget(args: argparse.Namespace) -> int:
    from capwatch.sizing.byte_units import parse_byte_size
    from capwatch.sizing.checks import SizingError

    if len(args.budget.strip()) > MAX_NUMBER_CHARACTERS:
        raise SizingError(f"--budget {_shown(args.budget)} is not a size like 2GiB or 512MiB")
    return parse_byte_size(args.budget)


def _output(args: argparse.Namespace) -> None:
    """Split ``--format``: an output format (table, json, csv) or, as before, a payload format."""
    from capwatch.output_format import OUTPUT_FORMATS
    from capwatch.sizing.checks import SizingError

    given = args.format_given
    if given is not None and given.strip().lower() in OUTPUT_FORMATS:
        if args.output is not None and args.output != given.strip().lower():
            raise SizingError(f"--format {given} and --json disagree: give one of them")
        args.output = given.strip().lower()
    elif given is not None:
        if args.payload_format is not None:
            raise SizingError(f"--format {given} and --payload-format {args.payload_format}: give the payload once")
        args.payload_format = given
        args.payload_flag = "--format"  # as the user spelled it, in messages
    args.output = args.output or "table"


def run(args: argparse.Namespace) -> int:
    from capwatch.backends import spec_of
    from capwatch.sizing.checks import SizingError

    _output(args)
    spec = spec_of(args.backend.strip().lower())
    planner, rules = spec.planner, spec.rules
    if (args.cap is None) == (args.budget is None):
        raise SizingError("give --cap (one or more caps) or --budget SIZE, exactly one of them")
    if args.ep_size is None:
        raise SizingError("give --ep-size N, the ranks in the expert-parallel group")
    foreign = [getattr(args, "payload_flag", option.flag) if option.dest == "payload_format" else option.flag
               for other in SPECS.values() if other is not spec for option in other.planner.options
               if getattr(args, option.dest) not in (None, False)]
    if foreign:
        raise SizingError(f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not an option of the "
                          f"{rules.name} backend (see capwatch plan --help)")
    geometry = _geometry(args, top_k_needed=planner.top_k_needed)
    options = planner.prepare({option.dest: getattr(args, option.dest) for option in planner.options}, geometry,
                              _integer("--ep-size", args.ep_size), _integer)
    return _answer(args, lambda cap: planner.plan_at(cap=cap, **options),
                   lambda budget: planner.largest_within(budget, **options, alignment=rules.alignment),
                   lambda plans, budget=None, title_note="": _print(planner.table(plans, geometry, budget,
                                                                                 title_note or None)),
                   planner.bytes_field, rules.alignment, rules)


def _answer(args: argparse.Namespace, plan_at, largest_within, print_table, bytes_field: str, alignment: int,
            rules=None) -> int:
    """The caps asked for, or the largest within ``--budget`` and the next aligned one (to show it does not fit):
    a table (``print_table``), JSON Lines or CSV. ``plan_at(cap)`` and ``largest_within(budget)`` are the
    backend's planner, its caps multiples of ``alignment`` (the backend's rules); a cap asked
    for off the backend's required alignment is flagged, as ``advise`` flags it (``rules.why_aligned``)."""
    import sys

    from capwatch.output_format import print_objects
    from capwatch.sizing.checks import SizingError

    if args.budget is not None:
        budget = _budget(args)
        best = largest_within(budget)
        try:
            above = plan_at(best.cap + alignment)
        except SizingError:  # past the most the backend takes
            above = None
        if args.output != "table":
            print_objects([{**best.as_dict(), "budget_bytes": budget, "next_cap": above.cap if above else None,
                            f"next_cap_{bytes_field}": getattr(above, bytes_field) if above else None}], args.output)
        else:
            print_table([best] + ([above] if above else []), title_note=f"budget {args.budget} = {budget:,} B per rank",
                        budget=budget)
        return 0
    caps = parse_caps(args.cap)
    plans = [plan_at(cap) for cap in caps]
    off = [cap for cap in caps if rules is not None and cap % rules.required_alignment]
    if args.output != "table":
        print_objects([{**plan.as_dict(), "aligned": plan.cap not in off} for plan in plans], args.output)
    else:
        print_table(plans)
    if off:
        shown = ", ".join(map(str, off[:8])) + (f" and {len(off) - 8} more" if len(off) > 8 else "")
        print(f"warning: cap {shown} {'is' if len(off) == 1 else 'are'} not a multiple of {rules.required_alignment}: "
              f"{rules.why_aligned}; set a multiple of {rules.required_alignment}",
              file=sys.stderr if args.output != "table" else sys.stdout)
    return 0


def _console():
    from rich.console import Console

    console = Console()
    console.width = max(console.width, 170)  # piped output defaults to 80 columns and would wrap
    return console


def _print(table) -> None:
    """A backend's ``PlanTable``: the table, its notes, its warnings in yellow."""
    from rich.table import Table

    console = _console()
    shown = Table(title=table.title, caption=table.caption)
    for header in table.headers:
        if header == "fits":
            shown.add_column(header, justify="center")
        else:
            shown.add_column(header, justify="right", overflow="fold")  # a narrow terminal wraps, never cuts
    for row in table.rows:
        shown.add_row(*row)
    console.print(shown)
    for note in table.notes:
        console.print(note, soft_wrap=True, highlight=False)
    for warning in table.warnings:
        console.print(warning, soft_wrap=True, style="yellow", highlight=False)

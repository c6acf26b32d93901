"""``capwatch plan``: what a per-rank dispatch cap costs in A2A memory: FlashInfer's MoE A2A workspace, or
DeepEP's buffer (``--backend deepep``).

Registration is cheap; sizing, rich and json load only when the command runs.
"""

from __future__ import annotations

import argparse
import functools

from capwatch.backends import SPECS
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

Modes: sglang (default) = what SGLang allocates (bf16 floor on dispatch bytes, so nvfp4 and fp8 cost the
bf16 figure; +128 B with --draft); flashinfer = FlashInfer's formula for the payload format, as a caller
other than SGLang allocates it; sglang-legacy = SGLang before PR #25907 (cap x ep_size passed as
max_num_tokens, an ep_size-fold over-allocation). Every table names its mode in its title.

Output: --format table (default), json (one object per cap or budget answer, a line each) or csv;
--json = --format json. A payload format given to --format (--format nvfp4) is --payload-format.

--backend deepep prices SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (1..1024) in the deep_ep.Buffer SGLang
allocates for --moe-a2a-backend deepep: the low-latency RDMA buffer, plus normal mode's buffers with
--deepep-mode auto (SGLang's default). Its experts are the routed ones + --redundant-experts + one slot per
rank per shared expert with --shared-experts-fusion (SGLang's --enforce-shared-experts-fusion).
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
                                                       "0.6.8, 22 after; not needed with --backend deepep)")
    geometry.add_argument("--num-experts", metavar="E", help=f"routed experts in the model (top-k..{MAX_NUM_EXPERTS})")
    parser.add_argument("--ep-size", metavar="N", help=f"ranks in the expert-parallel group (1..{MAX_EP_SIZE}; 256 "
                                                       "on 0.7.4)")
    parser.add_argument("--cap", metavar="CAPS", action="append",
                        help=f"per-rank cap(s): N, N,M,... or START:STOP[:STEP] (repeatable; 1..2^31-1, at most "
                             f"{MAX_CAPS} caps)")
    parser.add_argument("--budget", metavar="SIZE", help="per-rank workspace budget, e.g. 2GiB (at most "
                                                         f"{MAX_NUMBER_CHARACTERS} characters)")
    parser.add_argument("--payload-format", dest="payload_format", metavar="FORMAT", default=None,
                        help="dispatch payload: bf16, fp16, fp8, nvfp4, mxfp8, mxfp4, deepseek-fp8 (default bf16)")
    parser.add_argument("--format", dest="format_given", metavar="FORMAT", default=None,
                        help="output: table (default), json (one object per line) or csv; a payload format here "
                             "(--format nvfp4) is read as --payload-format, as before")
    parser.add_argument("--eplb-stats-experts", metavar="S", default=None,
                        help="experts in FlashInfer's EPLB stats region (0.6.16+; 0..num_experts; default 0)")
    parser.add_argument("--flashinfer-version", metavar="X.Y.Z", default=None,
                        help="flashinfer-python release (default 0.7.2.post1, the newest with MoeAlltoAll; "
                             "0.7.4 sizes NVLinkOneSidedAlltoAll)")
    parser.add_argument("--mode", default=None, metavar="MODE",
                        help="sglang (default: what SGLang allocates, bf16 dispatch bytes at least), flashinfer "
                             "(FlashInfer's own formula for the payload) or sglang-legacy")
    parser.add_argument("--draft", action="store_true", help="size SGLang's speculative draft dispatcher (+128 B)")
    parser.add_argument("--lamport-tokens", metavar="T", default=None,
                        help=f"0.7.4 only: Lamport transport token limit the run settles on (0..{LAMPORT_MAX_TOKENS_PER_RANK}; "
                             "default 0 = off)")
    parser.add_argument("--backend", metavar="NAME", default="flashinfer",
                        help=f"A2A backend, as --moe-a2a-backend names it: {', '.join(SPECS)} (default flashinfer)")
    deepep = parser.add_argument_group("DeepEP (--backend deepep)")
    deepep.add_argument("--deepep-mode", metavar="MODE", default=None,
                        help="auto (default, SGLang's: low-latency and normal buffers) or low_latency")
    deepep.add_argument("--redundant-experts", metavar="N", default=None,
                        help="SGLang's --ep-num-redundant-experts (default 0)")
    deepep.add_argument("--shared-experts-fusion", action="store_true",
                        help="SGLang's --enforce-shared-experts-fusion: one expert slot per rank per shared expert")
    deepep.add_argument("--shared-experts", metavar="S", default=None,
                        help="shared experts of a custom geometry (a preset knows its own)")
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


# Each backend's own options: given with the other backend, they are refused rather than ignored.
FLASHINFER_OPTIONS = {"payload_format": "--payload-format", "eplb_stats_experts": "--eplb-stats-experts",
                      "flashinfer_version": "--flashinfer-version", "mode": "--mode", "draft": "--draft",
                      "lamport_tokens": "--lamport-tokens"}
DEEPEP_OPTIONS = {"deepep_mode": "--deepep-mode", "redundant_experts": "--redundant-experts",
                  "shared_experts_fusion": "--shared-experts-fusion", "shared_experts": "--shared-experts"}


def _given(args: argparse.Namespace, options: dict[str, str]) -> list[str]:
    return [flag for name, flag in options.items() if getattr(args, name) not in (None, False)]


def _geometry(args: argparse.Namespace, top_k_needed: bool = True):
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.model_presets import custom_geometry, model_geometry

    custom = {"--hidden-size": args.hidden_size, "--top-k": args.top_k, "--num-experts": args.num_experts,
              "--shared-experts": args.shared_experts}
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
    top_k = _integer("--top-k", args.top_k) if args.top_k is not None else 1  # DeepEP's buffer does not use it
    shared = _integer("--shared-experts", args.shared_experts, 0) if args.shared_experts is not None else 0
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
    from capwatch.sizing.deepep_plan import DEEPEP
    from capwatch.sizing.checks import SizingError

    _output(args)
    rules = spec_of(args.backend.strip().lower()).rules
    if (args.cap is None) == (args.budget is None):
        raise SizingError("give --cap (one or more caps) or --budget SIZE, exactly one of them")
    if args.ep_size is None:
        raise SizingError("give --ep-size N, the ranks in the expert-parallel group")
    foreign = [getattr(args, "payload_flag", flag) if flag == "--payload-format" else flag
               for flag in _given(args, FLASHINFER_OPTIONS if rules is DEEPEP else DEEPEP_OPTIONS)]
    if foreign:
        raise SizingError(f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not an option of the "
                          f"{rules.name} backend (see capwatch plan --help)")
    return _run_deepep(args, rules) if rules is DEEPEP else _run_flashinfer(args, rules)


def _default_mode(args: argparse.Namespace) -> str:
    """``sglang`` (what SGLang allocates: the cap is SGLang's variable), unless the question is one SGLang never
    asks: a flashinfer release without the MoeAlltoAll SGLang calls (0.7.4), or an EPLB stats region."""
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.flashinfer_releases import LAYOUT_MOE_A2A, FlashInferVersion

    try:
        layout = FlashInferVersion.parse(args.flashinfer_version).layout
    except SizingError:  # an unknown release: plan_workspace says so in its own words
        return "sglang"
    return "sglang" if layout == LAYOUT_MOE_A2A and not args.eplb_stats_experts else "flashinfer"


def _run_flashinfer(args: argparse.Namespace, rules) -> int:
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.plan import MODES, largest_plan_within, plan_workspace

    mode = args.mode or _default_mode(args)
    if mode not in MODES:
        raise SizingError(f"unknown --mode {mode!r}; choose one of {', '.join(MODES)}")
    geometry = _geometry(args)
    options = dict(
        geometry=geometry, ep_size=_integer("--ep-size", args.ep_size),
        payload_format=(args.payload_format or "bf16").strip().lower(),
        eplb_stats_num_experts=_integer("--eplb-stats-experts", args.eplb_stats_experts or "0", 0),
        flashinfer_version=args.flashinfer_version, mode=mode, draft=args.draft,
        lamport_max_tokens=_integer("--lamport-tokens", args.lamport_tokens or "0", 0),
    )
    return _answer(args, lambda cap: plan_workspace(cap=cap, **options),
                   lambda budget: largest_plan_within(budget, **options, alignment=rules.alignment),
                   functools.partial(_print_table, geometry=geometry), "workspace_bytes_per_rank", rules.alignment,
                   rules)


def _run_deepep(args: argparse.Namespace, rules) -> int:
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.deepep_plan import DEEPEP_MODES, largest_deepep_plan_within, plan_deepep_buffer

    mode = (args.deepep_mode or "auto").strip().lower()
    if mode not in DEEPEP_MODES:
        raise SizingError(f"unknown --deepep-mode {mode!r}; choose one of {', '.join(DEEPEP_MODES)} (normal mode "
                          "has no low-latency buffer and no token cap)")
    geometry = _geometry(args, top_k_needed=False)
    if args.shared_experts_fusion and not geometry.shared_experts:
        raise SizingError(f"{geometry.name} has no shared experts to fuse: drop --shared-experts-fusion"
                          + (" or give --shared-experts S" if geometry.name == "custom" else ""))
    options = dict(geometry=geometry, ep_size=_integer("--ep-size", args.ep_size), deepep_mode=mode,
                   redundant_experts=_integer("--redundant-experts", args.redundant_experts or "0", 0),
                   fused_shared_experts=geometry.shared_experts if args.shared_experts_fusion else 0)
    return _answer(args, lambda cap: plan_deepep_buffer(cap=cap, **options),
                   lambda budget: largest_deepep_plan_within(budget, **options, alignment=rules.alignment),
                   _print_deepep_table, "memory_bytes_per_rank", rules.alignment, rules)


def _answer(args: argparse.Namespace, plan_at, largest_within, print_table, bytes_field: str, alignment: int,
            rules=None) -> int:
    """The caps asked for, or the largest within ``--budget`` and the next aligned one (to show it does not fit):
    a table (``print_table``), JSON Lines or CSV. ``plan_at(cap)`` and ``largest_within(budget)`` are the
    backend's planner, its caps multiples of ``alignment`` (the backend's, ``sizing/backends.py``); a cap asked
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


def _print_deepep_table(plans, budget: int | None = None, title_note: str = "") -> None:
    from rich.table import Table

    from capwatch.sizing.byte_units import format_bytes, format_gib
    from capwatch.sizing.deepep_plan import DEEPEP, DEEPEP_WORKSPACE_BYTES, NVSHMEM_HEAP_STEP_BYTES

    first, console = plans[0], _console()
    extra = "".join(part for part in (
        f" + {first.redundant_experts} redundant" if first.redundant_experts else "",
        f" + {first.fused_shared_experts} x {first.ep_size} fused shared" if first.fused_shared_experts else ""))
    title = (f"{first.model}: H={first.hidden_size}, E={first.num_experts}{extra} -> DeepEP experts "
             f"{first.buffer_experts} | ep_size={first.ep_size}, deepep mode {first.deepep_mode}")
    table = Table(title=title, caption=title_note or None)
    normal = first.deepep_mode == "auto"
    headers = ["cap/rank", "low-latency RDMA"] + (["normal NVL", "normal RDMA"] if normal else []) + \
        ["buffer/rank", "bytes/rank", "memory/rank", "EP group", "NVSHMEM_QP_DEPTH", "vs SGLang's 2048 MB"]
    for header in headers:
        table.add_column(header, justify="right", overflow="fold")  # a narrow terminal wraps, never cuts
    if budget is not None:
        table.add_column("fits", justify="center")
    for plan in plans:
        row = [f"{plan.cap:,}", format_bytes(plan.low_latency_rdma_bytes)]
        if normal:
            row += [format_bytes(plan.normal_nvl_bytes), format_bytes(plan.normal_rdma_bytes)]
        row += [format_bytes(plan.buffer_bytes_per_rank), f"{plan.buffer_bytes_per_rank:,}",
                format_bytes(plan.memory_bytes_per_rank), format_bytes(plan.buffer_bytes_group), f"{plan.nvshmem_qp_depth:,}",
                f"+{format_bytes(plan.over_sglang_reserve_bytes)} over" if plan.over_sglang_reserve_bytes else "within"]
        if budget is not None:
            row.append("yes" if plan.memory_bytes_per_rank <= budget else "no")
        table.add_row(*row)
    console.print(table)
    if budget is not None:
        console.print(f"largest 128-aligned cap whose memory/rank is within budget: {first.cap}")
    largest = max(plans, key=lambda plan: plan.cap)
    console.print(f"memory/rank = the RDMA buffer as NVSHMEM maps it ({format_bytes(NVSHMEM_HEAP_STEP_BYTES)} steps: "
                  f"{format_bytes(largest.nvshmem_heap_bytes_at_least)} at cap {largest.cap})"
                  + (" + the NVLink buffer" if normal else "")
                  + f" + DeepEP's {format_bytes(DEEPEP_WORKSPACE_BYTES)} workspace: what a budget is held against",
                  soft_wrap=True, highlight=False)
    over = [plan for plan in plans if plan.over_sglang_reserve_bytes]
    if over:
        plan = min(over, key=lambda plan: plan.cap)
        console.print(f"warning: from cap {plan.cap} the buffer ({format_gib(plan.buffer_bytes_per_rank)} per rank) "
                      f"outgrows the {format_gib(plan.sglang_reserve_bytes)} SGLang's automatic --mem-fraction-static "
                      f"reserves for DeepEP whatever {DEEPEP.cap_env_var} is: set --mem-fraction-static lower by the "
                      "difference or expect the KV pool or CUDA-graph capture to run out of memory",
                      soft_wrap=True, style="yellow", highlight=False)


def _print_table(plans, geometry, title_note: str = "", budget: int | None = None) -> None:
    from rich.table import Table

    from capwatch.sizing.byte_units import format_bytes

    first, console = plans[0], _console()
    title = (f"{geometry.name}: H={geometry.hidden_size}, top-k={geometry.top_k}, E={geometry.num_experts} | "
             f"ep_size={first.ep_size}, {first.payload_format}, flashinfer {first.flashinfer_version} "
             f"({first.layout}), mode {first.mode}{', draft' if first.draft else ''}"
             + (f", EPLB stats {first.eplb_stats_num_experts}" if first.eplb_stats_num_experts else ""))
    table = Table(title=title, caption=title_note or None)
    for header in ("cap/rank", "max_num_tokens", "dispatch B/tok", "combine B/tok", "aux",
                   "workspace/rank", "bytes/rank", "EP group", "expert rows"):
        table.add_column(header, justify="right", overflow="fold")  # a narrow terminal wraps, never cuts
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
        from capwatch.sizing.flashinfer_releases import FLASHINFER

        at_limit = first.cap == FLASHINFER.max_cap_tokens
        console.print(f"largest 128-aligned cap within budget: {first.cap}" +
                      (" (the largest cap capwatch sizes; the budget holds more)" if at_limit else ""))

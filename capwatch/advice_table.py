"""Advice on a terminal: the one renderer of ``capwatch advise`` and ``capwatch demo``.

It reads the objects ``GET /v1/clusters/{cluster}/advice`` and ``/whatif`` answer (plain dicts, so the
CLI needs no service install to print them). ``ADVICE_FIELDS`` is the one list of what a reader sees of
an advice and how each value is written: each advice reads as a card (a field a line, fitting 80 columns),
then its reasons and the line to export, or why it cannot be advised.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal

from capwatch.sizing.byte_units import format_gib


def _gib(value: int | None) -> str:
    return "-" if value is None else format_gib(value)


def _signed_gib(value: int | None) -> str:
    return "-" if value is None else f"{'+' if value >= 0 else '-'}{format_gib(abs(value))}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def percent(value: float | None) -> str:
    """A share as the web page writes it (charts.js ``formatPercent``): one decimal below 10 %, none above, halves
    rounded up on the float's exact value (JavaScript's toFixed), so the CLI and the page show the same text."""
    if value is None:
        return "-"
    places = Decimal("0.1") if 0 < value < 0.1 else Decimal("1")
    return f"{Decimal(value * 100).quantize(places, ROUND_HALF_UP)}%"


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _count(value: float) -> str:
    """A predicted count: three significant digits, whole numbers from 100 on (8,640, not 8.64e+03)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _per_day(value: float | None, high: float | None = None) -> str:
    if value is None:
        return "-"
    return _count(value) + ("" if high is None else f" (band up to {_count(high)})")


def _tokens(value: int | None) -> str:
    return "-" if value is None else str(value)


def _bounds(advice: dict) -> str:
    return "-" if advice["lower_bound"] is None else f"{advice['lower_bound']} - {advice['upper_bound']}"


def _action(advice: dict) -> str:
    """The action, with what qualifies it first: a cap in use that is unknown, low confidence."""
    marks = [mark for mark, on in (("cap unknown", advice.get("cap_known") is False),
                                   ("low confidence", advice.get("low_confidence"))) if on]
    return advice["action"] + (f" ({', '.join(marks)})" if marks else "")


def _current_cap(advice: dict) -> str:
    """The cap in use; one the advice only assumed (a log read without --cap) says so."""
    text = _tokens(advice["current_cap"])
    return text if advice.get("cap_known", True) else f"unknown (assumed {text})"


def _estimated(advice: dict, which: str) -> str:
    """"≈ " before a workspace figure that is an estimate (a reported-bytes buffer away from its reported cap):
    ``which`` names the field (``workspace_bytes_exact_<which>``; "" for a what-if row's ``workspace_bytes_exact``)."""
    return "≈ " if advice.get("workspace_bytes_exact" + (f"_{which}" if which else "")) is False else ""


def _priced(advice: dict) -> str:
    """How the price's bytes are known: "exact", or in proportion to the bytes reported at which cap."""
    reported_cap = advice.get("workspace_bytes_reported_cap")
    if reported_cap is not None:
        return f"estimate from cap {reported_cap}'s report"
    return advice.get("workspace_bytes_basis") or "-"


# (label, how the value reads): the card's lines and the table's columns, in this order.
ADVICE_FIELDS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("action", _action),
    ("backend", lambda advice: advice["a2a_backend"]),
    ("current cap", _current_cap),
    # who set it: "applied by capwatch at start (revision N)", the operator, SGLang's default (ranks that say)
    ("cap set by", lambda advice: advice.get("cap_origin") or "-"),
    ("recommended cap", lambda advice: _tokens(advice["recommended_cap"])),
    ("bounds", _bounds),
    ("confidence", lambda advice: percent(advice["confidence"])),
    ("group peak R seen", lambda advice: _tokens(advice["max_peak_runtime_tokens"])),
    # The share of windows above a cap in the decaying histogram (recent windows weigh more), not a count.
    ("overflow share now -> after", lambda advice: f"{_rate(advice['predicted_overflow_rate_current'])} -> "
                                                   f"{_rate(advice['predicted_overflow_rate_recommended'])} "
                                                   "decay-weighted"),
    ("overflow windows/day after", lambda advice: _per_day(
        advice.get("predicted_overflow_windows_per_day_recommended"),
        advice.get("predicted_overflow_windows_per_day_recommended_high"))),
    ("workspace/rank now -> after", lambda advice: (
        f"{_estimated(advice, 'current')}{_gib(advice['workspace_bytes_per_rank_current'])} -> "
        f"{_estimated(advice, 'recommended')}{_gib(advice['workspace_bytes_per_rank_recommended'])}")),
    ("group change", lambda advice: (
        ("≈ " if _estimated(advice, "current") or _estimated(advice, "recommended") else "")
        + _signed_gib(advice["workspace_bytes_group_delta"]))),
    # exact, or an estimate: a reported-bytes buffer (DeepEP v2, NIXL, Mooncake) is exact only at its reported cap
    ("workspace priced", _priced),
    ("windows seen", lambda advice: f"{plural(advice['sample_count'], 'window')}, {advice['overflow_windows']:,} "
                                    "overflowed"),
)


def _stdout():
    from rich.console import Console

    return Console()


def advice_card(advice: dict):
    """One advice as a card: a field a line, label then value. Its width is the longest label and value, about
    60 columns, so it fits an 80-column terminal and a pipe; a value longer than the room folds, never cut.
    Values are text, never markup."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"capwatch advice for cluster '{advice['cluster']}'", title_justify="left",
                  show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in ADVICE_FIELDS:
        table.add_row(label, Text(value(advice)))
    return table


def print_advice(advices: list[dict], console=None) -> None:
    """Per cluster its card, its reasons and the line to export (one card per cluster, never a row too wide to
    read); then the clusters that cannot be advised (an ``{"cluster", "error"}`` entry) say why, and those
    without ranks of the role asked about (an ``{"cluster", "skipped"}`` entry) say that. On ``console`` (a rich
    Console; default: stdout)."""
    console = console or _stdout()
    advisable = [advice for advice in advices if "error" not in advice and "skipped" not in advice]
    for index, advice in enumerate(advisable):
        if index:
            console.print()
        console.print(advice_card(advice))
        for reason in advice["reasons"]:
            console.print(f"  - {reason}", soft_wrap=True, markup=False, highlight=False)
        if advice["env"]:
            console.print(f"export {advice['env']}", soft_wrap=True, style="green", markup=False, highlight=False)
        else:
            console.print("no change suggested yet", markup=False, highlight=False)
    if advisable and len(advisable) < len(advices):
        console.print()
    for advice in advices:
        if "error" in advice:
            console.print(f"{advice['cluster']}: cannot be advised: {advice['error']}", soft_wrap=True, markup=False,
                          highlight=False)
        elif "skipped" in advice:
            console.print(f"{advice['cluster']}: {advice['skipped']}", soft_wrap=True, markup=False, highlight=False)


def print_whatif(rows: list[dict], console=None) -> None:
    """The what-if curve: per cap, predicted overflowing windows per day (with its band) and the cost."""
    from rich.table import Table

    console = console or _stdout()

    table = Table(title="capwatch what-if: predicted overflows and cost per cap")
    for column in ("cap", "overflow windows/day", "band", "workspace/rank", "group change", "KV tokens/rank freed",
                   "below floor"):
        table.add_column(column, justify="right", overflow="fold")  # narrow: wrapped, never cut
    for row in rows:
        low = row.get("predicted_overflow_windows_per_day_low")
        high = row.get("predicted_overflow_windows_per_day_high")
        freed = row.get("kv_cache_tokens_per_rank_freed")
        # "≈" after a cap whose bytes (and the change and KV tokens priced from them) are an estimate
        table.add_row(str(row["cap"]) + (" ≈" if _estimated(row, "") else ""),
                      _per_day(row.get("predicted_overflow_windows_per_day")),
                      "-" if low is None else f"{_count(low)}..{_count(high)}", _gib(row["workspace_bytes_per_rank"]),
                      _signed_gib(row["workspace_bytes_group_delta"]), "-" if freed is None else f"{freed:,}",
                      "yes" if row["below_floor"] else "no")
    console.print(table)
    if any(row.get("workspace_bytes_exact") is False for row in rows):
        console.print("≈ after a cap: its workspace, group change and KV tokens are estimates (the buffer's bytes are "
                      "known exactly only at the cap they were reported at)", soft_wrap=True, markup=False,
                      highlight=False)

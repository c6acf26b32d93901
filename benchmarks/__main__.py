"""The one benchmark runner: ``python -m benchmarks NAME [--quick] [--smoke] [--json]``.

A benchmark is any module ``benchmarks/<name>.py`` exposing ``run(quick: bool = False) -> dict``
(JSON-serialisable figures). ``NAME`` is one of them or ``all``; ``all`` runs every one and
writes ``docs/benchmarks.md`` with the machine and the date. ``--json`` prints the figures as
one object. Exit status 2 for an unknown name, 1 when a benchmark failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import inspect
import json
import os
import pkgutil
import platform
import sys
import time
import traceback
from pathlib import Path

import benchmarks
from tests.support.checkout import REPO_ROOT

DEFAULT_REPORT = REPO_ROOT / "docs" / "benchmarks.md"


def available() -> list[str]:
    """Every benchmark module (those exposing ``run``), sorted."""
    names = []
    for module in pkgutil.iter_modules(benchmarks.__path__):
        if module.name.startswith("_"):
            continue
        if callable(getattr(importlib.import_module(f"benchmarks.{module.name}"), "run", None)):
            names.append(module.name)
    return sorted(names)


def machine() -> dict:
    """CPU model, cores, memory, OS and the versions that matter for the figures."""
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_bytes = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_bytes = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    info = {
        "cpu_model": cpu_model,
        "cpu_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(memory_bytes / 2**30, 1) if memory_bytes else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        # Other work on the machine moves every figure: say how busy it was when the run began.
        "load_average_1m_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def run_one(name: str, quick: bool, smoke: bool = False) -> dict:
    """{"figures": ..., "seconds": ...} or {"error": ...}: one failure never hides the others. ``smoke``: a few calls
    of everything (a benchmark whose ``run`` takes ``smoke``; the others run quick)."""
    started = time.perf_counter()
    try:
        run = importlib.import_module(f"benchmarks.{name}").run
        smoke_run = smoke and "smoke" in inspect.signature(run).parameters
        figures = run(quick=quick or smoke, smoke=True) if smoke_run else run(quick=quick or smoke)
        json.dumps(figures)  # fail here, not in the report, when a figure is not JSON
    except Exception as error:  # noqa: BLE001 - reported, and the exit status says so
        return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(),
                "seconds": round(time.perf_counter() - started, 2)}
    return {"figures": figures, "seconds": round(time.perf_counter() - started, 2)}


def flatten(figures, prefix: str = "") -> list[tuple[str, object]]:
    """Nested figures as (dotted key, value) rows; lists of scalars stay one value."""
    if isinstance(figures, dict):
        rows = []
        for key, value in figures.items():
            rows.extend(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    if isinstance(figures, list) and figures and all(isinstance(item, dict) for item in figures):
        rows = []
        for index, item in enumerate(figures):
            rows.extend(flatten(item, f"{prefix}[{index}]"))
        return rows
    return [(prefix, figures)]


def format_value(value) -> str:
    if isinstance(value, float):
        if value == 0 or 0.001 <= abs(value) < 1e7:
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"
        return f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(item) for item in value)
    return str(value)


def _markdown_cell(value) -> str:
    return format_value(value).replace("|", "\\|").replace("\n", " ")


def _describe(name: str) -> str:
    """The module docstring, paragraphs kept, lines joined."""
    doc = (importlib.import_module(f"benchmarks.{name}").__doc__ or "").strip()
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n"))


def _as_table(value) -> list[dict] | None:
    """A dict of dicts ({"bare": {...}, "capwatch": {...}} or {"1": {...}, "8": {...}}) reads best as a
    table: one row per entry, one column per (dotted) figure, blank where an entry lacks one."""
    if not isinstance(value, dict) or len(value) < 2 or not all(isinstance(row, dict) and row for row in value.values()):
        return None
    rows = [{"": name, **dict(flatten(row))} for name, row in value.items()]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return [{column: row.get(column, "") for column in columns} for row in rows]


def _markdown_table(table: list[dict]) -> list[str]:
    columns = list(table[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_markdown_cell(row.get(column, "")) for column in columns) + " |" for row in table]
    return lines + [""]


def _render_figures(figures) -> list[str]:
    # A benchmark may return ready tables: {"tables": {"title": [{"col": v, ...}, ...]}}; a dict of
    # same-shaped dicts becomes a table too; everything else is a figure/value row.
    if not isinstance(figures, dict):
        figures = {"value": figures}
    tables = dict(figures.get("tables", {}))
    scalars = {}
    for key, value in figures.items():
        if key == "tables":
            continue
        table = _as_table(value)
        if table is not None:
            tables[key.replace("_", " ")] = table
        else:
            scalars[key] = value
    # Top-level entries measured the same way ({"bare": {...}, "naive": {...}, "capwatch": {...}}): side by side.
    groups: list[list[str]] = []
    shapes = {key: set(dict(flatten(value))) for key, value in scalars.items() if isinstance(value, dict) and value}
    for key, shape in shapes.items():
        for group in groups:
            first = shapes[group[0]]
            if len(first & shape) >= 0.5 * len(first | shape):
                group.append(key)
                break
        else:
            groups.append([key])
    for group in (group for group in groups if len(group) >= 2):
        flat = {key: dict(flatten(scalars.pop(key))) for key in group}
        figures_in_order = list(dict.fromkeys(name for values in flat.values() for name in values))
        tables = {" vs ".join(group): [{"figure": name, **{key: flat[key].get(name, "") for key in group}}
                                        for name in figures_in_order], **tables}
    lines: list[str] = []
    rows = flatten(scalars)
    if rows:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {key} | {_markdown_cell(value)} |" for key, value in rows]
        lines.append("")
    for title, table in tables.items():
        if table:
            lines += [f"**{title}**", ""] + _markdown_table(table)
    return lines


def render_report(results: dict[str, dict], quick: bool, machine_info: dict, when: dt.datetime) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Measured {when.strftime('%Y-%m-%d %H:%M UTC')} with `python -m benchmarks all{' --quick' if quick else ''}`"
        " (regenerate with the same command; every figure below comes from that run).",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {key.replace('_', ' ')} | {_markdown_cell(value)} |" for key, value in machine_info.items()]
    lines += ["", "## Summary", "", "| benchmark | status | seconds |", "|---|---|---|"]
    for name, result in results.items():
        status = "failed: " + _markdown_cell(result["error"]) if "error" in result else "ok"
        lines.append(f"| [{name}](#{name.replace('_', '-')}) | {status} | {result['seconds']} |")
    lines.append("")
    for name, result in results.items():
        lines += [f"## {name.replace('_', '-')}", "", _describe(name) or f"`benchmarks/{name}.py`", "",
                  f"Run alone: `python -m benchmarks {name}{' --quick' if quick else ''}`.", ""]
        if "error" in result:
            lines += ["Failed:", "", "```", result["traceback"].rstrip(), "```", ""]
        else:
            lines += _render_figures(result["figures"])
    return "\n".join(lines).rstrip() + "\n"


def print_table(name: str, result: dict) -> None:
    print(f"== {name} ({result['seconds']} s)")
    if "error" in result:
        print(result["traceback"].rstrip(), file=sys.stderr)
        return
    figures = result["figures"]
    tables = figures.get("tables", {}) if isinstance(figures, dict) else {}
    rows = flatten({key: value for key, value in figures.items() if key != "tables"} if tables else figures)
    width = max((len(key) for key, _ in rows), default=0)
    for key, value in rows:
        print(f"  {key.ljust(width)}  {format_value(value)}")
    for title, table in tables.items():
        if not table:
            continue
        columns = list(table[0])
        cells = [[format_value(row.get(column, "")) for column in columns] for row in table]
        widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
        print(f"  {title}:")
        print("    " + "  ".join(column.ljust(widths[i]) for i, column in enumerate(columns)))
        for line in cells:
            print("    " + "  ".join(value.ljust(widths[i]) for i, value in enumerate(line)))


def main(argv: list[str] | None = None) -> int:
    names = available()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", metavar="NAME", help=f"one of: all, {', '.join(names) or '(none found)'}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (CI, 2 cores)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--smoke", action="store_true",
                        help="a few calls of everything, anywhere (CI: figures meaningless; gpu_counting on CPU)")
    parser.add_argument("--output", type=Path, default=DEFAULT_REPORT,
                        help="where `all` writes the Markdown report (default: docs/benchmarks.md)")
    args = parser.parse_args(argv)
    if args.name != "all" and args.name not in names:
        parser.error(f"unknown benchmark {args.name!r}; choose all or one of: {', '.join(names)}")

    selected = names if args.name == "all" else [args.name]
    machine_info, started_at = machine(), dt.datetime.now(dt.timezone.utc)
    results: dict[str, dict] = {}
    for name in selected:
        if not args.json:
            print(f"running {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        results[name] = run_one(name, args.quick, args.smoke)
        if not args.json:
            print_table(name, results[name])

    if args.name == "all" and not args.smoke:  # smoke figures mean nothing: no report
        report = render_report(results, args.quick, machine_info, started_at)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report, encoding="utf-8")
        if not args.json:
            print(f"wrote {args.output}", file=sys.stderr)
    if args.json:
        payload = {name: result.get("figures", {"error": result.get("error")}) for name, result in results.items()}
        if args.name != "all":
            payload = payload[args.name]
        print(json.dumps(payload, indent=2, sort_keys=False))
    return 1 if any("error" in result for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""How a command prints what it found: ``--format table|json|csv`` (KRR's habit), ``--json`` its alias.

- ``table``: for a person, fitted to the terminal (80 columns in a pipe), never a value cut.
- ``json``: one JSON object per result (an advice, a what-if row, a plan), one per line (JSON Lines), whether
  one or many: ``jq`` and ``json.loads`` of each line read both alike.
- ``csv``: a header and a row per result, the objects' own fields (raw numbers, no units)."""

from __future__ import annotations

import argparse
import json
import sys

OUTPUT_FORMATS: tuple[str, ...] = ("table", "json", "csv")


def add_format_arguments(parser: argparse.ArgumentParser, *, flag: str = "--format", dest: str = "output") -> None:
    """``--format table|json|csv`` (default table) and ``--json`` (= ``--format json``)."""
    parser.add_argument(flag, dest=dest, choices=OUTPUT_FORMATS, default=None,
                        help="output: table (default, for a person), json (one object per line) or csv")
    parser.add_argument("--json", dest=dest, action="store_const", const="json",
                        help="the same as --format json")


def print_json_lines(objects: list[dict], stream=None) -> None:
    stream = stream or sys.stdout
    for item in objects:
        stream.write(json.dumps(item, separators=(",", ":")) + "\n")


def csv_cell(value) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return value


def print_csv(objects: list[dict], stream=None) -> None:
    """A header of every field any object has (in first-seen order), a row per object."""
    import csv

    columns = list(dict.fromkeys(key for item in objects for key in item))
    writer = csv.writer(stream or sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for item in objects:
        writer.writerow([csv_cell(item.get(column)) for column in columns])


def print_objects(objects: list[dict], output: str) -> None:
    """``objects`` as ``json`` or ``csv`` (a table is each command's own)."""
    print_json_lines(objects) if output == "json" else print_csv(objects)

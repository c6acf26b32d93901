"""docs/service.md states every setting of the service with its default and range, as the code has them (the
table `capwatch serve --help` prints too): a setting added, renamed or re-bounded without the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

from capwatch.service.config import settings_reference

DOC = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()


def test_the_settings_table_is_the_codes():
    rows = re.findall(r"^\| `(CAPWATCH_[A-Z_]+)` \| `([^`]*)` \| ([^|]*) \|", DOC, flags=re.MULTILINE)
    documented = [(name, default, bounds.strip()) for name, default, bounds in rows]
    expected = [(name, default, bounds or "-") for name, default, bounds, _ in settings_reference()]
    assert documented == expected


def test_serve_help_lists_every_setting_with_its_range():
    from capwatch.commands.serve import settings_help

    text = settings_help()
    for name, default, bounds, _ in settings_reference():
        line = f"  {name}={default}" + (f"  range {bounds}" if bounds else "")
        assert line in text.splitlines(), line


def test_every_numeric_setting_is_bounded_at_both_ends():
    """Issue #20: a finite but harmful value (CAPWATCH_WINDOW_S=1e-300 made /advice answer 500) must be refused at
    start, so every number the service reads (each duration, window, count and size) has a range closed or open
    at both ends; a setting added without one fails here."""
    import typing

    from capwatch.advisor.policy import AdvisorPolicy
    from capwatch.service.config import Settings

    numeric = {f"{prefix}{name.upper()}" for prefix, model in (("CAPWATCH_", Settings), ("CAPWATCH_ADVISOR__",
                                                                                         AdvisorPolicy))
               for name, field in model.model_fields.items()
               if {int, float} & {field.annotation, *typing.get_args(field.annotation)}}
    assert "CAPWATCH_WINDOW_S" in numeric and "CAPWATCH_MAX_CLUSTERS" in numeric
    unbounded = [name for name, _, bounds, _ in settings_reference()
                 if name in numeric and ("inf" in bounds or not bounds)]
    assert unbounded == []

"""Where each alert's ``runbook_url`` points: a heading of docs/runbook.md, one per alert.

The base is where the docs are published; ``RUNBOOK_BASE`` is this repository's copy. A test resolves every
rule's URL to a heading of the file, so a renamed alert or heading cannot leave a dead link.
"""

from __future__ import annotations

import re

RUNBOOK_BASE = "https://github.com/a2a-capwatch/capwatch/blob/main/docs/runbook.md"


def anchor(heading: str) -> str:
    """The fragment GitHub (and most Markdown renderers) give a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_url(alert: str, base: str = RUNBOOK_BASE) -> str:
    """The URL of an alert's section: its heading is the alert's name."""
    return f"{base}#{anchor(alert)}"

"""Every alert carries a ``runbook_url`` that resolves to a heading of docs/runbook.md."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from capwatch.dashboards.runbooks import RUNBOOK_BASE, anchor, runbook_url

from tests.dashboards import lint
from tests.support.checkout import REPO_ROOT

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"


def headings(markdown: str) -> dict[str, str]:
    """Each heading's anchor -> its text, outside code fences."""
    found, fenced = {}, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.+)", line)
        if match:
            found[anchor(match.group(1))] = match.group(1)
    return found


def alerts(rule_file: dict) -> list[dict]:
    return [rule for group in rule_file["groups"] for rule in group["rules"] if "alert" in rule]


def test_every_alert_links_its_own_runbook_heading(rule_file):
    sections = headings(RUNBOOK.read_text())
    base = urlsplit(RUNBOOK_BASE)
    assert base.path.endswith("/docs/runbook.md")  # the published copy of this very file
    assert len(alerts(rule_file)) >= 13
    for rule in alerts(rule_file):
        url = urlsplit(rule["annotations"]["runbook_url"])
        assert (url.scheme, url.netloc, url.path) == (base.scheme, base.netloc, base.path), rule["alert"]
        assert url.fragment in sections, f"{rule['alert']}: #{url.fragment} is no heading of {RUNBOOK}"
        assert sections[url.fragment] == rule["alert"]  # its own section, not a neighbour's


def test_the_runbook_has_no_section_for_an_alert_that_is_gone(rule_file):
    named = {rule["alert"] for rule in alerts(rule_file)}
    sections = {text for text in headings(RUNBOOK.read_text()).values() if re.fullmatch(r"[A-Z]\w+", text)}
    assert sections == named


def test_the_anchor_is_githubs():
    assert anchor("MoeA2ACapSaturating") == "moea2acapsaturating"
    assert anchor("The database file (`service/store/file_watch.py`)") == "the-database-file-servicestorefile_watchpy"
    assert runbook_url("CapwatchServiceDown").endswith("/docs/runbook.md#capwatchservicedown")


def test_the_rule_lint_wants_a_runbook_url():
    rule = {"alert": "MoeA2AThing", "expr": "vector(1)", "labels": {"severity": "info"},
            "annotations": {"summary": "s", "description": "d"}}
    assert any("runbook_url" in finding for finding in lint.lint_rules({"groups": [{"name": "g", "rules": [rule]}]}))

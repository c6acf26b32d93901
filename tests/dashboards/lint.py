"""Checks mirroring grafana/dashboard-linter's rules (its Go binary cannot be installed here), plus PromQL
checks shared with the Prometheus rules. Each check returns findings as strings; an empty list means clean.

PromQL is parsed for real by promtool (``promtool_parse_errors``); the structural checks (counters only under
rate, ``$__rate_interval`` in rate windows, metric names that exist) walk a token stream, which is enough for
the selectors, function calls and label lists these expressions use.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from capwatch.dashboards import service_metrics
from capwatch.sglang_plugin.start_check import CAP_SHORTFALL
from capwatch.telemetry import catalogue

PROMTOOL = "promtool"
RATE_FUNCTIONS = {"rate", "irate", "increase"}
COUNTER_FUNCTIONS = RATE_FUNCTIONS | {"resets"}  # what may read a counter's raw value
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
# The linter's panel-units-rule list, narrowed to the units these dashboards may sensibly use.
VALID_UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "decbytes", "ops", "cps", "reqps", "s", "ms", "bool",
}
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "atan2", "inf", "nan", "Inf", "NaN",
}
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# What Grafana substitutes; only the syntax matters for parsing, the E2E test uses real windows.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$__range_s": "3600",
}

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
      | (?P<variable>\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)
      | (?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:[smhdwy]|ms)?(?:\d+(?:[smhdwy]|ms))*)
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<punct>!=|=~|!~|==|>=|<=|[(){}\[\],=<>+\-*/%^@])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Selector:
    """One instant or range vector selector in an expression."""

    metric: str
    range: str | None  # the text inside [...] when it is a range selector
    enclosing_function: str | None  # the function whose parentheses directly hold the selector


def tokens(expr: str) -> list[tuple[str, str]]:
    out, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot tokenize PromQL at {expr[position:position + 20]!r} in {expr!r}")
        position = match.end()
        if match.lastgroup != "space":
            out.append((match.lastgroup, match.group()))
    return out


def selectors(expr: str) -> list[Selector]:
    """Vector selectors with their range and the function call directly around them."""
    toks = tokens(expr)
    # Each open parenthesis pushes (function name or None, is a label list).
    stack: list[tuple[str | None, bool]] = []
    found: list[Selector] = []
    brace_depth = 0
    aggregation = None  # an aggregation whose parenthesis comes after its by/without list
    index = 0
    while index < len(toks):
        kind, text = toks[index]
        following = toks[index + 1][1] if index + 1 < len(toks) else ""
        if text == "{":
            brace_depth += 1
        elif text == "}":
            brace_depth -= 1
        elif text == "(":
            previous_kind, previous = toks[index - 1] if index else ("", "")
            is_label_list = previous in LABEL_LIST_KEYWORDS
            function = previous if previous_kind == "ident" and not is_label_list and previous not in KEYWORDS else None
            if previous == ")" and aggregation is not None and not is_label_list:
                function, aggregation = aggregation, None
            stack.append((function, is_label_list))
        elif text == ")":
            stack.pop()
        elif kind == "ident" and text in AGGREGATIONS and following in ("by", "without"):
            aggregation = text
        elif (
            kind == "ident" and brace_depth == 0 and following != "("
            and text not in KEYWORDS and not (stack and stack[-1][1])
        ):
            cursor = index + 1
            if cursor < len(toks) and toks[cursor][1] == "{":
                while toks[cursor][1] != "}":
                    cursor += 1
                cursor += 1
            selector_range = None
            if cursor < len(toks) and toks[cursor][1] == "[":
                end = cursor
                while toks[end][1] != "]":
                    end += 1
                selector_range = "".join(part for _, part in toks[cursor + 1:end])
            found.append(Selector(text, selector_range, stack[-1][0] if stack else None))
        index += 1
    return found


# --- dashboards ----------------------------------------------------------------------------------------------


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel that is not a row, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def targets(dashboard: dict) -> Iterator[tuple[dict, dict]]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def annotation_queries(dashboard: dict) -> list[dict]:
    """The dashboard's Prometheus annotations (the built-in one has no expression)."""
    return [item for item in dashboard.get("annotations", {}).get("list", []) if item.get("expr")]


def query_variables(dashboard: dict) -> list[dict]:
    return [v for v in dashboard.get("templating", {}).get("list", []) if v.get("type") == "query"]


def variable_selector(query: str | dict) -> str:
    """The PromQL inside ``label_values(<selector>, label)`` (or the query itself for query_result)."""
    text = query if isinstance(query, str) else query.get("query", "")
    match = re.fullmatch(r"label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)", text.strip())
    if match:
        return match.group(1)
    match = re.fullmatch(r"query_result\((.*)\)", text.strip())
    return match.group(1) if match else text


def keeps_rank(expr: str) -> bool:
    """Whether the result still has one series per rank: a rank selector not aggregated away."""
    if 'ep_rank=~"$ep_rank"' not in expr:
        return False
    groupings = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    if groupings:
        return all("ep_rank" in grouping for grouping in groupings)
    return not re.search(r"\b(?:sum|max|min|avg|count|count_values|topk|bottomk|quantile|group)\s*\(", expr)


def _uses_datasource_variable(reference: object) -> bool:
    return isinstance(reference, dict) and reference.get("uid") in ("$datasource", "${datasource}")


def lint_dashboard(dashboard: dict) -> list[str]:
    title = dashboard.get("title", "?")
    findings: list[str] = []
    templating = dashboard.get("templating", {}).get("list", [])
    datasource_variables = [v for v in templating if v.get("type") == "datasource"]
    # template-datasource-rule
    if [(v.get("name"), v.get("query")) for v in datasource_variables] != [("datasource", "prometheus")]:
        findings.append(f"{title}: needs exactly one datasource variable named 'datasource' of type prometheus")
    elif datasource_variables[0].get("label") != "Data source":
        findings.append(f"{title}: the datasource variable should be labeled 'Data source'")
    # template-*-rule, template-on-time-change-reload-rule
    for variable in query_variables(dashboard):
        name = variable.get("name")
        if not _uses_datasource_variable(variable.get("datasource")):
            findings.append(f"{title}: variable {name} does not query $datasource")
        if variable.get("refresh") != 2:
            findings.append(f"{title}: variable {name} must refresh on time range change (2)")
        if not (variable.get("multi") and variable.get("includeAll") and variable.get("allValue") == ".+"):
            findings.append(f"{title}: variable {name} must be multi-select with All = '.+'")
        if not any(f"${name}" in target.get("expr", "") for _, target in targets(dashboard)):
            findings.append(f"{title}: variable {name} is used by no query")
    # uneditable-dashboard
    if dashboard.get("editable", True):
        findings.append(f"{title}: generated dashboards must not be editable in the UI")
    for panel in panels(dashboard):
        where = f"{title} / {panel.get('title', '?')}"
        if panel.get("type") == "graph":
            findings.append(f"{where}: uses the deprecated graph panel; use timeseries")
        # panel-title-description-rule
        if not panel.get("title") or not panel.get("description"):
            findings.append(f"{where}: needs a title and a description")
        # panel-units-rule (for every panel, not only the linter's types)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in VALID_UNITS:
            findings.append(f"{where}: unit {unit!r} is missing or not one of {sorted(VALID_UNITS)}")
        # panel-datasource-rule
        if not _uses_datasource_variable(panel.get("datasource")):
            findings.append(f"{where}: does not use the datasource variable")
        # panel-no-targets-rule
        if not panel.get("targets"):
            findings.append(f"{where}: has no queries")
        for target in panel.get("targets", []):
            if not _uses_datasource_variable(target.get("datasource")):
                findings.append(f"{where}: query {target.get('refId')} does not use the datasource variable")
            if target.get("format") != "table" and target.get("legendFormat") in (None, "", "__auto"):
                findings.append(f"{where}: query {target.get('refId')} needs a legend")
            if target.get("format") != "table" and keeps_rank(target.get("expr", "")) \
                    and "{{ep_rank}}" not in target.get("legendFormat", ""):
                findings.append(f"{where}: a per-rank series needs the rank in its legend ('rank {{{{ep_rank}}}}')")
            findings += [f"{where}: {finding}" for finding in lint_expression(target.get("expr", ""), dashboard=True)]
    for annotation in annotation_queries(dashboard):
        where = f"{title} / annotation {annotation.get('name', '?')}"
        if not _uses_datasource_variable(annotation.get("datasource")):
            findings.append(f"{where}: does not use the datasource variable")
        findings += [f"{where}: {finding}" for finding in lint_expression(annotation["expr"], dashboard=True)]
    return findings


# --- expressions (dashboards and rules) ----------------------------------------------------------------------


def known_metrics() -> set[str]:
    # The SGLang plugin's own series beside the catalogue's (served from a scheduler's start, before any dispatch).
    names = {"up", CAP_SHORTFALL} | set(service_metrics.SERVICE_METRICS)
    for spec in catalogue.METRICS:
        if spec.type == "histogram":
            names |= {spec.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(spec.name)
    names |= {service_metrics.INGEST_LATENCY_SECONDS + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def lint_expression(expr: str, *, dashboard: bool, recorded: Iterable[str] = ()) -> list[str]:
    """target-counter-agg-rule, target-rate-interval-rule and 'every metric exists' for one expression."""
    findings = []
    allowed = known_metrics() | set(recorded)
    for selector in selectors(expr):
        if selector.metric not in allowed:
            findings.append(f"metric {selector.metric} is neither in telemetry.catalogue, the plugin's series nor "
                            "the service contract")
        if selector.metric.endswith(COUNTER_SUFFIXES) and (
            selector.range is None or selector.enclosing_function not in COUNTER_FUNCTIONS
        ):
            findings.append(f"counter {selector.metric} is not inside rate/irate/increase/resets: {expr}")
        if dashboard and selector.range is not None and selector.enclosing_function in COUNTER_FUNCTIONS \
                and selector.range != "$__rate_interval":
            findings.append(f"{selector.enclosing_function} over [{selector.range}] should use $__rate_interval")
    return findings


def substitute_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """Grafana's substitution: built-ins first, then ``$name``/``${name}`` from values (default ``.+``)."""
    for name, value in GRAFANA_SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    values = values or {}
    return re.sub(
        r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
        lambda match: values.get(match.group(1), ".+"),
        expr,
    )


def promtool_parse_errors(expressions: list[str]) -> str:
    """Parse each expression with promtool (as recording rules in a temporary rule file). Returns promtool's
    output when any fails, else ''."""
    rules = {"groups": [{"name": "lint", "rules": [
        {"record": f"lint:expression_{index}:parse", "expr": expr} for index, expr in enumerate(expressions)
    ]}]}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "expressions.rules.yml"
        path.write_text(yaml.safe_dump(rules, sort_keys=False))
        result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        return ""
    numbered = "\n".join(f"  expression_{index}: {expr}" for index, expr in enumerate(expressions))
    return f"{result.stdout}{result.stderr}\n{numbered}"


def lint_rules(rule_file: dict) -> list[str]:
    findings = []
    rules = [rule for group in rule_file["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    for rule in rules:
        name = rule.get("record") or rule.get("alert")
        if "record" in rule and not re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]):
            findings.append(f"recording rule {name} is not level:metric:operations")
        if "alert" in rule:
            if not re.fullmatch(r"[A-Z][a-z0-9]*(?:[A-Z0-9]+[a-z0-9]*)+", rule["alert"]):
                findings.append(f"alert {name} is not CamelCase")
            if rule.get("labels", {}).get("severity") not in {"info", "warning", "critical"}:
                findings.append(f"alert {name} needs a severity label (info, warning or critical)")
            if not {"summary", "description"} <= set(rule.get("annotations", {})):
                findings.append(f"alert {name} needs summary and description annotations")
            if not rule.get("annotations", {}).get("runbook_url"):
                findings.append(f"alert {name} needs a runbook_url annotation (a heading of docs/runbook.md)")
        findings += [f"{name}: {finding}" for finding in lint_expression(rule["expr"], dashboard=False,
                                                                          recorded=recorded)]
    return findings

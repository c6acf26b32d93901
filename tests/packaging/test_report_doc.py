"""docs/report.md documents the report body (``RankReport``) exactly as the service validates it: its field
tables are the model's JSON schema, rendered here; a field added, removed or re-ranged in
``telemetry/report.py`` fails this test until the doc says so (issue #31, symptom 9: the report body was
documented nowhere in docs/). Regenerate the tables with ``python -m tests.packaging.test_report_doc``."""

from __future__ import annotations

import json

from capwatch.telemetry.report import RankReport

from tests.support.checkout import REPO_ROOT

DOC = REPO_ROOT / "docs" / "report.md"
BEGIN, END = "<!-- fields: generated from RankReport, see tests/packaging/test_report_doc.py -->", "<!-- /fields -->"


def _type(spec: dict, definitions: dict) -> str:
    if "$ref" in spec:
        return f"[{spec['$ref'].rsplit('/', 1)[1]}](#{spec['$ref'].rsplit('/', 1)[1].lower()})"
    if "anyOf" in spec:
        return " or ".join(_type(option, definitions) for option in spec["anyOf"])
    if "enum" in spec:
        return " \\| ".join(json.dumps(value) for value in spec["enum"])
    if "const" in spec:
        return json.dumps(spec["const"])
    kind = spec.get("type", "any")
    if kind == "array":
        items = spec.get("items") or spec.get("prefixItems")
        inner = ", ".join(_type(item, definitions) for item in items) if isinstance(items, list) else \
            _type(items or {}, definitions)
        return f"list of [{inner}]" if isinstance(items, list) else f"list of {inner}"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
            "null": "null"}.get(kind, kind)


def _bounds(spec: dict) -> str:
    parts = []
    for option in spec.get("anyOf", [spec]):
        for key, word in (("minimum", ">= "), ("exclusiveMinimum", "> "), ("maximum", "<= "), ("exclusiveMaximum", "< "),
                          ("minLength", "length >= "), ("maxLength", "length <= "), ("maxItems", "items <= "),
                          ("pattern", "matches ")):
            if key in option:
                parts.append(f"{word}`{option[key]}`" if key == "pattern" else f"{word}{option[key]:,}")
    return ", ".join(parts)


def _table(title: str, model: dict, definitions: dict) -> list[str]:
    required = set(model.get("required", []))
    lines = [f"### {title}", "", "| field | type | required / default | range |", "|---|---|---|---|"]
    for name, spec in model["properties"].items():
        needed = "required" if name in required else f"default `{json.dumps(spec.get('default'))}`"
        lines.append(f"| `{name}` | {_type(spec, definitions)} | {needed} | {_bounds(spec)} |")
    return lines + [""]


def rendered_tables() -> str:
    schema = RankReport.model_json_schema()
    definitions = schema["$defs"]
    lines = _table("RankReport", schema, definitions)
    for name in sorted(definitions):
        lines += _table(name, definitions[name], definitions)
    return "\n".join(lines)


def documented_tables() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def test_docs_report_md_has_the_report_schema_as_the_service_validates_it():
    assert documented_tables() == rendered_tables().strip()


def test_the_documented_example_is_a_valid_report():
    text = DOC.read_text()
    example = text.split("```json", 1)[1].split("```", 1)[0]
    RankReport.model_validate_json(example)


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(text[:text.index(BEGIN) + len(BEGIN)] + "\n\n" + rendered_tables().strip() + "\n\n"
                   + text[text.index(END):])

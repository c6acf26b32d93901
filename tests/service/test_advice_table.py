"""``capwatch.advice_table``, the one renderer of ``capwatch advise`` and ``capwatch demo``, over the
objects the service answers (``ClusterAdvice``, ``WhatIf``, dumped to JSON as the CLI receives them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from capwatch.advisor.advice import ClusterAdvice, WhatIf
from rich.console import Console

from capwatch.advice_table import ADVICE_FIELDS, percent, print_advice, print_whatif

WEB = Path(__file__).resolve().parents[2] / "service" / "web"

ENV_VAR = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def advice(cluster: str, **changes) -> dict:
    """An advice object exactly as GET /v1/clusters/{cluster}/advice serialises one."""
    values = dict(
        action="lower", current_cap=4096, recommended_cap=1280, target_cap=1280, lower_bound=896, upper_bound=2432,
        confidence=0.875, predicted_overflow_rate_current=0.0, predicted_overflow_rate_recommended=0.00125,
        workspace_bytes_per_rank_current=471_859_200, workspace_bytes_per_rank_recommended=147_456_000,
        workspace_bytes_group_current=4 * 471_859_200, workspace_bytes_group_recommended=4 * 147_456_000,
        workspace_bytes_group_delta=4 * (147_456_000 - 471_859_200), ep_size=4, floor_cap=None, budget_cap=None,
        sample_count=70, overflow_windows=2, history_s=70.0, covered_history_s=70.0, max_peak_runtime_tokens=994,
        env=f"{ENV_VAR}=1280", reasons=["the group's peak R per 1 s window reached 994 tokens",
                                        "a reason with [bold]brackets[/bold] prints as written"],
        predicted_overflow_windows_per_day_recommended=0.5, predicted_overflow_windows_per_day_recommended_high=3.0,
        cluster=cluster, role="target", generated_unix_s=1.8e9)
    values.update(changes)
    return json.loads(ClusterAdvice(**values).model_dump_json())


def rendered(print_function, objects, width: int = 260) -> str:
    console = Console(record=True, width=width, color_system=None)
    print_function(objects, console)
    return console.export_text()


def test_one_advice_is_a_card_with_its_reasons_and_the_line_to_export():
    text = rendered(print_advice, [advice("demo")])
    assert "capwatch advice for cluster 'demo'" in text
    lines = text.splitlines()
    for label, value in ADVICE_FIELDS:  # every field on a line of its own, label then value
        assert any(label in line and value(advice("demo")) in line for line in lines), label
    assert "│ bounds" in text and "896 - 2432" in text and "0.00% -> 0.12% decay-weighted" in text
    assert "0.5 (band up to 3)" in text and "88%" in text
    assert "0.44 GiB -> 0.14 GiB" in text and "-1.21 GiB" in text and "70 windows, 2 overflowed" in text
    assert "  - a reason with [bold]brackets[/bold] prints as written" in text  # text, never markup
    assert [line for line in lines if line.strip()][-1] == f"export {ENV_VAR}=1280"


def test_several_advices_are_a_row_each_then_each_clusters_reasons_and_errors():
    holding = advice("prod-b", action="insufficient_data", recommended_cap=None, target_cap=None, lower_bound=None,
                     upper_bound=None, env=None, workspace_bytes_per_rank_recommended=None,
                     workspace_bytes_group_recommended=None, workspace_bytes_group_delta=None,
                     reasons=["5 group samples covering 0 min"])
    text = rendered(print_advice, [advice("prod-a"), holding, {"cluster": "prod-c", "role": "target",
                                                               "error": "ranks disagree on the cap"}])
    titles = [line.strip() for line in text.splitlines() if line.startswith("capwatch advice for cluster")]
    assert titles == ["capwatch advice for cluster 'prod-a'", "capwatch advice for cluster 'prod-b'"]
    second = text[text.index("cluster 'prod-b'"):]
    assert any("action" in line and "insufficient_data" in line for line in second.splitlines())
    assert any("bounds" in line and "\u2502 - " in line for line in second.splitlines())
    assert text.index("cluster 'prod-a'") < text.index(f"export {ENV_VAR}=1280") < text.index("cluster 'prod-b'") \
        < text.index("no change suggested yet") < text.index("prod-c: cannot be advised: ranks disagree on the cap")


CUT = "\u2026"  # rich's ellipsis: a value cut to fit


@pytest.mark.parametrize("width", [80, 120])
def test_several_clusters_fit_the_terminal_and_no_value_is_cut(width):
    """Issue #31, symptom 7: with several clusters `capwatch advise` printed one row per cluster, about 220
    columns: at 80 or 120 the values themselves were cut ("flash\u2026", "0.83..4.\u2026"), in a pipe too."""
    advices = [advice("prod-a"), advice("decode-pool-eu-west", a2a_backend="deepep",
                                        cap_variable="SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
                                        current_cap=1024, recommended_cap=384,
                                        env="SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=384"),
               advice("prod-c", confidence=0.8333)]
    text = rendered(print_advice, advices, width=width)
    boxed = [line for line in text.splitlines() if line.startswith(("\u2502", "\u250c", "\u2514"))]
    assert boxed and max(len(line.rstrip()) for line in boxed) <= width
    assert CUT not in text
    for item in advices:
        for label, value in ADVICE_FIELDS:
            assert any(label in line and value(item) in line for line in text.splitlines()), (item["cluster"], label)


def test_each_backend_names_its_own_variable():
    deepep = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
    card = rendered(print_advice, [advice("decode", a2a_backend="deepep", cap_variable=deepep, current_cap=1024,
                                          recommended_cap=384, env=f"{deepep}=384")])
    assert any("backend" in line and "deepep" in line for line in card.splitlines())
    assert card.strip().splitlines()[-1] == f"export {deepep}=384"
    both = rendered(print_advice, [advice("prod-a"), advice("decode", a2a_backend="deepep", cap_variable=deepep,
                                                                    env=f"{deepep}=384")])
    assert "cluster 'decode'" in both and "cluster 'prod-a'" in both
    assert f"export {deepep}=384" in both and f"export {ENV_VAR}=1280" in both


@pytest.mark.parametrize("width", [60, 100])
def test_a_narrow_terminal_still_shows_every_value(width):
    text = " ".join(rendered(print_advice, [advice("demo")], width=width).split())
    for value in ("lower", "4096", "1280", "896 - 2432", "994", f"export {ENV_VAR}=1280"):
        assert value in text


def test_whatif_rows_show_the_band_the_cost_and_the_floor():
    rows = [json.loads(WhatIf(cap=cap, predicted_overflow_rate=rate, workspace_bytes_per_rank=cap * 100_000,
                              workspace_bytes_group=4 * cap * 100_000, workspace_bytes_group_delta=delta,
                              aligned=True, below_floor=cap < 512, within_budget=None,
                              predicted_overflow_windows_per_day=per_day, predicted_overflow_windows_per_day_low=low,
                              predicted_overflow_windows_per_day_high=high,
                              kv_cache_tokens_per_rank_freed=freed).model_dump_json())
            for cap, rate, delta, per_day, low, high, freed in [
                (256, 0.2, -3 << 30, 674.0, 611.0, 8640.0, 12_571), (4096, 0.0, 0, None, None, None, None)]]
    text = rendered(print_whatif, rows)
    [small] = [line for line in text.splitlines() if line.startswith("│  256")]
    assert "674" in small and "611..8,640" in small and "-3.00 GiB" in small and "12,571" in small and "yes" in small
    [large] = [line for line in text.splitlines() if line.startswith("│ 4096")]
    assert "+0.00 GiB" in large and " no " in large and large.count(" - ") >= 2


SHARES = (0.125, 0.0833, 0.875, 0.005, 0.0995, 0.3, 1.0, 0.0)


def test_confidence_reads_as_the_page_writes_it():
    """Issue #31 symptom 8: confidence 0.125 read "0.12" in the CLI and "13%" on the page. The card writes a share
    as the page's own formatPercent does (charts.js, run by node)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's charts.js cannot be run")
    script = (Path(WEB) / "charts.js").read_text() + (
        f"\nconsole.log(JSON.stringify({json.dumps(SHARES)}.map(Charts.formatPercent)));")
    page = json.loads(subprocess.run([node, "-"], input=script, capture_output=True, text=True, check=True).stdout)
    assert [percent(share) for share in SHARES] == page and page[0] == "13%"
    card = rendered(print_advice, [advice("demo", confidence=0.125)])
    assert any("confidence" in line and "13%" in line for line in card.splitlines()), card


def test_one_window_is_one_window():
    """Issue #31 symptom 8: "1 windows"."""
    card = rendered(print_advice, [advice("demo", sample_count=1, overflow_windows=0)])
    assert "1 window, 0 overflowed" in card and "1 windows" not in card

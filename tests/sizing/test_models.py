import pytest
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import (
    MODEL_ALIASES,
    MODEL_PRESETS,
    custom_geometry,
    known_model_names,
    model_geometry,
)

# (hidden_size, routed experts, top-k) from each model's published config.json.
PUBLISHED = {
    "deepseek-v3": (7168, 256, 8), "deepseek-r1": (7168, 256, 8), "deepseek-v2": (5120, 160, 6),
    "kimi-k2": (7168, 384, 8), "qwen3-235b-a22b": (4096, 128, 8), "qwen3-30b-a3b": (2048, 128, 8),
    "qwen3-next-80b-a3b": (2048, 512, 10), "gpt-oss-120b": (2880, 128, 4), "gpt-oss-20b": (2880, 32, 4),
    "mixtral-8x7b": (4096, 8, 2),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_geometry_and_source(name):
    geometry = model_geometry(name)
    assert (geometry.hidden_size, geometry.num_experts, geometry.top_k) == PUBLISHED[name]
    assert geometry.name == name and "config.json" in geometry.source


def test_every_preset_is_covered():
    assert set(MODEL_PRESETS) == set(PUBLISHED)


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [("DeepSeek-V3", "deepseek-v3"), ("deepseek-ai/DeepSeek-R1", "deepseek-r1"), ("DEEPSEEK_R1", "deepseek-r1"),
     ("deepseek-r1-0528", "deepseek-r1"), ("moonshotai/Kimi-K2-Instruct", "kimi-k2"), ("Kimi-K2", "kimi-k2"),
     ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
     ("openai/gpt-oss-120b", "gpt-oss-120b"), ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
     ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"), (" mixtral ", "mixtral-8x7b")],
)
def test_names_are_case_insensitive_with_aliases(spelling, canonical):
    assert model_geometry(spelling).name == canonical


def test_aliases_point_at_presets():
    assert set(MODEL_ALIASES.values()) <= set(MODEL_PRESETS)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(SizingError) as error:
        model_geometry("llama-4-maverick")
    message = str(error.value)
    assert "unknown model 'llama-4-maverick'" in message
    assert all(name in message for name in known_model_names())


def test_custom_geometry_is_checked():
    assert custom_geometry(1024, 4, 64).name == "custom"
    for args in ((0, 4, 64), (1024, -1, 64), (1024, 4, 0)):
        with pytest.raises(SizingError, match="must be positive"):
            custom_geometry(*args)
    with pytest.raises(SizingError, match="top_k 9 exceeds num_experts 8"):
        custom_geometry(1024, 9, 8)

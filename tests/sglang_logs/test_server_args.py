"""The start-up args line, both forms, parsed (never evaluated), by SGLang's own rules."""

from __future__ import annotations

import dataclasses

import pytest
from capwatch.advisor.floor import deployment_floor
from capwatch.sglang_logs.server_args import UnreadableArgs, parse_args, read_server_args, server_config
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import sglang_logs as sg


def config_of(message: str):
    return read_server_args(message.removeprefix("server_args="))


@pytest.mark.parametrize("chunk, expected_cap, mode, floor", [
    (16384, 16384, "null", 16384), (2048, 4096, "null", 2048), (8192, 8192, "decode", 256)])
def test_sglangs_default_cap_and_floor_rules(chunk, expected_cap, mode, floor):
    config = config_of(sg.args_message(sg.server_args(chunked_prefill_size=chunk, disaggregation_mode=mode)))
    assert config.default_cap == expected_cap
    assert deployment_floor(config.limits, None).tokens == floor


def test_args_rules_max_running_requests_and_disabled_graphs():
    args = sg.server_args(decode_max_bs=512, max_running_requests=1024, attn_dp_size=8, prefill_backend="full",
                          prefill_max_bs=8192, chunked_prefill_size=4096)
    limits = server_config(args).limits
    assert limits.decode_cuda_graph_max_batch_size == 128  # min(512, 1024 // 8)
    assert limits.prefill_cuda_graph_max_batch_size == 8192
    assert server_config(sg.server_args(decode_backend="disabled")).limits.decode_cuda_graph_max_batch_size == 0
    assert server_config(sg.server_args(disaggregation_mode="prefill")).limits.decode_cuda_graph_max_batch_size == 0
    # a value whose repr is not Python syntax does not make the line unreadable
    text = sg.args_message(sg.server_args()).replace("'dtype': 'auto'", "'dtype': <DType.auto: 'auto'>")
    assert config_of(text).tp_size == 8
    text = sg.args_message(sg.server_args(watchdog_timeout=float("inf"), mem_fraction_static=float("nan")))
    assert "inf" in text and config_of(text).ep_size == 8
    assert len(parse_args(sg.args_message(sg.server_args()).removeprefix("server_args="))) >= 542


def test_the_repr_form_reads_like_the_dict_form():
    """The same settings in 0.5.18's repr and 0.5.23's dict give the same configuration, but for the words of
    the default cap's rule (the chunked-prefill size before 0.5.22, the prefill buffer since: here equal) and
    the floor's rule (the same terms; no start-up check before 0.5.19)."""
    settings_ = dict(tp_size=8, ep_size=8, chunked_prefill_size=8192, speculative_algorithm="EAGLE",
                     speculative_num_draft_tokens=4, max_running_requests=2048, disaggregation_mode="decode")
    old = config_of(sg.server_args_repr("0.5.18", **settings_, decode_max_bs=256, dp_size=8))
    new = config_of(sg.args_message(sg.server_args(**settings_, decode_max_bs=256, attn_dp_size=8)))
    assert (old.limits.floor_rule, new.limits.floor_rule) == ("capwatch_prefill", "sglang")
    old = dataclasses.replace(old, limits=old.limits.model_copy(update={"floor_rule": "sglang"}))
    assert dataclasses.replace(old, default_rule=None) == dataclasses.replace(new, default_rule=None)
    assert (old.default_rule.prefill_name, new.default_rule.prefill_name) == ("chunked prefill", "prefill buffer")
    assert old.default_cap == new.default_cap == 8192
    assert old.tokens_per_request == 4 and old.limits.decode_cuda_graph_max_batch_size == 256


@pytest.mark.parametrize("shape", ["0.5.21", "0.5.23"])
def test_which_rules_the_args_line_says_the_server_ran_by(shape):
    """0.5.22 added the start-up check on the cap: 0.5.23's floor is SGLang's, prefill chunk included, and
    its default comes from the prefill buffer; 0.5.19 - 0.5.21's dict (no check, eager prefill through an
    all-gather) has the decode graph as its floor and the chunked-prefill size in its default. 0.5.18's repr
    (no check, but prefill through the A2A) keeps the chunk in its floor."""
    settings_ = dict(chunked_prefill_size=8192, decode_max_bs=256, enable_dynamic_chunking=True, pp_size=2,
                     max_prefill_tokens=32768)
    args = sg.server_args_0_5_21(**settings_) if shape == "0.5.21" else sg.server_args(**settings_)
    config = config_of(sg.args_message(args))
    floor = deployment_floor(config.limits, None)
    assert config.limits.max_prefill_buffer_tokens == 32768  # max(32768, 1.25 x 8192): PP dynamic chunking
    if shape == "0.5.21":
        assert config.limits.floor_rule == "capwatch" and config.default_cap == 8192
        assert (floor.tokens, floor.binds) == (256, "the decode CUDA-graph batch 256 x 1 token per request")
        assert "no start-up check" in floor.why
    else:
        assert config.limits.floor_rule == "sglang" and config.default_cap == 32768
        assert floor.tokens == 32768 and "prefill chunk" in floor.binds and "refuses to start" in floor.why
    assert config.attn_dp_size == 8 and config.default_rule.words("flashinfer").endswith(f"{config.default_cap}, 4096)")
    repr_config = config_of(sg.server_args_repr("0.5.18", chunked_prefill_size=8192, decode_max_bs=256))
    repr_floor = deployment_floor(repr_config.limits, None)
    assert repr_config.limits.floor_rule == "capwatch_prefill"
    assert repr_floor.tokens == 8192 and "prefill chunk" in repr_floor.binds
    assert "no start-up check" in repr_floor.why and "refuses to start" not in repr_floor.why


def test_the_repr_is_parsed_not_evaluated():
    """A call in the args is read as a record; nothing named in it runs."""
    evil = "ServerArgs(tp_size=8, ep_size=8, model_path=__import__('os').system('touch /tmp/pwned'))"
    config = read_server_args(evil)
    assert config.tp_size == 8 and config.model_path is None


@pytest.mark.parametrize("text, why", [
    ("{'tp_size': 8, 'model_path': ", "not Python syntax"),
    ("{'model_path': 'x'}", "neither tp_size nor ep_size"),
    ("[1, 2, 3]", "neither a dict nor"),
    ("{'tp_size': 8} and more", "not one dict"),
    ("{'tp_size': " + "9" * 4001 + "}", "not a plausible value"),
    ("{'tp_size': " + "9" * 5000 + "}", "not Python syntax"),
    ("{'tp_size': 8, 'chunked_prefill_size': 10**9}", "not a plausible value"),  # 10**9 is an expression: None
    ("{'tp_size': 8, 'chunked_prefill_size': 1000000000}", "not a plausible value"),
    ("{'tp_size': 8, 'speculative_algorithm': 'EAGLE', 'speculative_num_draft_tokens': 5000}", "not a plausible"),
    ("{'a': " * 300 + "1" + "}" * 300, "not Python syntax"),
    ("{'tp_size': 8, 'x': " + "[" * 40 + "]" * 40 + "}", "nested deeper"),
    # Issue #36 (symptom 9): negative sizes were read as 1 and 0, a number as the backend as "a release before it".
    ("{'tp_size': -5}", r"tp_size='-5' is not a plausible value \(at least 1\)"),
    ("{'tp_size': 8, 'ep_size': -1}", "ep_size='-1' is not a plausible value"),
    ("{'tp_size': 8, 'ep_num_redundant_experts': -5}", r"ep_num_redundant_experts='-5' is not a plausible value \(at "
                                                       "least 0\)"),
    ("{'tp_size': 8, 'moe_a2a_backend': " + "1" + "0" * 30 + "}", "moe_a2a_backend=.* is not a backend name"),
    ("{'tp_size': 8, 'moe_a2a_backend': 'deep ep'}", "is not a backend name"),
])
def test_args_that_do_not_read_say_why_in_one_line(text, why):
    if "10**9" in text:  # an expression is no value SGLang logs: read as unset
        assert read_server_args(text).default_cap == 4096
        return
    with pytest.raises(UnreadableArgs, match=why) as caught:
        read_server_args(text)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_an_args_line_longer_than_any_sglang_one_is_refused_before_parsing():
    from capwatch.sglang_logs.server_args import MAX_ARGS_CHARS

    with pytest.raises(UnreadableArgs, match="more than any SGLang args line"):
        read_server_args("{'tp_size': 8, 'x': '" + "a" * MAX_ARGS_CHARS + "'}")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_after_the_mark_reads_or_is_unreadable_args(text):
    try:
        read_server_args(text)
    except UnreadableArgs:
        pass


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["tp_size", "ep_size", "dp_size", "attn_dp_size", "chunked_prefill_size",
                                        "max_running_requests", "speculative_num_draft_tokens",
                                        "decode_log_interval", "enable_dp_attention", "speculative_algorithm",
                                        "moe_a2a_backend", "model_path", "cuda_graph_max_bs",
                                        "disaggregation_mode"]),
                       st.one_of(st.integers(-(10 ** 30), 10 ** 30), st.floats(), st.text(max_size=20), st.none(),
                                 st.booleans(), st.lists(st.integers(), max_size=3)), min_size=1))
def test_any_values_give_a_configuration_or_a_one_line_refusal(args):
    """Whatever the values, a configuration (whose limits validate) or UnreadableArgs; never a traceback."""
    args.setdefault("tp_size", 8)
    try:
        config = server_config(args)
    except UnreadableArgs as error:
        assert "\n" not in str(error)
        return
    assert 1 <= config.tokens_per_request <= 1024 and config.default_cap >= 4096


def test_an_args_line_of_many_small_items_is_refused_in_bounded_memory():
    """Issue #36 (F7b): a dict just under the 1 Mi-character bound, of small items, cost 529 MB to parse."""
    import tracemalloc

    text = "{'tp_size': 8, 'x': [" + "1," * ((1 << 20) // 2 - 40) + "1]}"
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableArgs, match="items, more than any SGLang args line"):
            read_server_args(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB"

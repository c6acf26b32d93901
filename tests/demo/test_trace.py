"""The JSON Lines trace format: what it accepts and how it says what is wrong."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capwatch.demo.trace import TraceError, parse_trace, read_trace, write_trace
from capwatch.demo.workload import Workload


def parse(text: str):
    return parse_trace(io.StringIO(text), source="t.jsonl")


def test_ranks_follow_the_trace_and_times_are_optional():
    workload = parse('{"tokens": [1, 2, 3]}\n\n{"tokens": [0, 5, 9]}\n')
    assert workload.ranks == 3 and workload.steps == 2 and workload.step_times_s is None
    timed = parse('{"tokens": [4], "t": 0}\n{"tokens": [7], "t": 0.5}\n')
    assert timed.token_counts == [[4], [7]] and timed.step_times_s == [0.0, 0.5]


def test_round_trip(tmp_path):
    workload = Workload(token_counts=[[1, 2], [3, 4]], step_times_s=[0.0, 1.25])
    path = tmp_path / "trace.jsonl"
    with path.open("w") as handle:
        write_trace(workload, handle)
    again = read_trace(path)
    assert again.token_counts == workload.token_counts and again.step_times_s == workload.step_times_s


@pytest.mark.parametrize("text, line, words", [
    ('{"tokens": [1, 2]}\n{"tokens": [1, 2]\n', 2, "not valid JSON"),
    ('[1, 2]\n', 1, "expected an object"),
    ('{"tokens": [1, 2]}\n{"token": [1, 2]}\n', 2, "unknown key(s) 'token'"),
    ('{"t": 1}\n', 1, 'missing "tokens"'),
    ('{"tokens": []}\n', 1, "non-empty list"),
    ('{"tokens": [1, 2.5]}\n', 1, '"tokens"[1] must be an integer, got 2.5'),
    ('{"tokens": [1, true]}\n', 1, '"tokens"[1] must be an integer'),
    ('{"tokens": [1, -3]}\n', 1, "outside 0.."),
    ('{"tokens": [1, 2]}\n{"tokens": [1, 2, 3]}\n', 2, "lists 3 ranks but the first step lists 2"),
    ('{"tokens": [1], "t": 0}\n{"tokens": [1]}\n', 2, '"t" must be given on every line or on none'),
    ('{"tokens": [1], "t": 2}\n{"tokens": [1], "t": 1}\n', 2, "goes back in time"),
    ('{"tokens": [1], "t": -1}\n', 1, '"t" must be a number of seconds in 0..3600'),
    ('{"tokens": [1], "t": 1e9}\n', 1, "(the replay runs in real time), got 1000000000.0"),
    ('{"tokens": [1], "t": 1e999}\n', 1, '"t" must be a number of seconds'),
    ('{"tokens": [' + "7" * 5000 + ']}\n', 1, "has 5000 digits (at most 18)"),
    ('{"tokens": [1], "t": ' + "9" * 5000 + '}\n', 1, "has 5000 digits"),
    ("[" * 5000 + "]" * 5000 + "\n", 1, "nested too deeply"),
    ("[" * 200_000 + "\n", 1, "longer than 65,536 characters"),
    ('{"tokens": [1], "t": "soon"}\n', 1, '"t" must be a number'),
    ('{"tokens": [' + ", ".join(["1"] * 65) + ']}\n', 1, "at most 64"),
])
def test_bad_lines_name_the_line_and_the_problem(text, line, words):
    with pytest.raises(TraceError) as error:
        parse(text)
    assert str(error.value).startswith(f"t.jsonl:{line}: ")
    assert words in str(error.value)


def test_reading_is_bounded_whatever_the_file_holds(tmp_path):
    """/dev/zero has no line end: one bounded read, one line of error (it once grew to 23.7 GB)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TraceError, match=r"^/dev/zero:1: longer than 65,536 characters"):
        read_trace("/dev/zero")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: under 64 MiB more
    too_many = tmp_path / "long.jsonl"
    too_many.write_text('{"tokens": [1]}\n' * 100_001)
    with pytest.raises(TraceError, match="long.jsonl:100001: more than 100,000 steps"):
        read_trace(too_many)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(TraceError, match="no steps"):
        parse("\n\n")
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(tmp_path / "binary.jsonl")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["tokens", "t", "x"]), children,
                                                                      max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80), _json_values.map(json.dumps)), max_size=6))
def test_any_input_is_a_workload_or_one_trace_error(lines):
    """Hostile input ends in a TraceError (one line) or a valid workload, never another exception."""
    try:
        workload = parse("\n".join(lines) + "\n")
    except TraceError as error:
        assert "\n" not in str(error) and str(error).startswith("t.jsonl")
    else:
        assert workload.steps >= 1 and all(len(step) == workload.ranks for step in workload.token_counts)

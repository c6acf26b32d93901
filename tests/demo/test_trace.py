"""The JSON Lines trace format: what it accepts and how it says what is wrong."""

from __future__ import annotations

import io

import pytest

from capwatch.trace import TraceError, parse_trace, read_trace, write_trace
from capwatch.workload import Workload


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
    ('{"tokens": [1], "t": -1}\n', 1, '"t" must be a number of seconds >= 0'),
    ('{"tokens": [1], "t": "soon"}\n', 1, '"t" must be a number'),
    ('{"tokens": [' + ", ".join(["1"] * 65) + ']}\n', 1, "at most 64"),
])
def test_bad_lines_name_the_line_and_the_problem(text, line, words):
    with pytest.raises(TraceError) as error:
        parse(text)
    assert str(error.value).startswith(f"t.jsonl:{line}: ")
    assert words in str(error.value)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(TraceError, match="no steps"):
        parse("\n\n")
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(tmp_path / "binary.jsonl")

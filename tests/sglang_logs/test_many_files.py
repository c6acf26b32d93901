"""Many files, one timeline: per rank, per node, rotated, duplicated, in any order, plain or gzip -> the same
history as their merge; a line that cannot be placed never lets the advice sit below it."""

from __future__ import annotations

import json
import random

from capwatch.sglang_logs.timeline import REORDER_S, Timeline
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sglang_logs.logs import DP, T0, advise, decode_lines, rank, read, read_description, traffic, write
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]


def per_rank_logs(minutes: int = 60, hot_rank: int = 5, hot_peak: int = 620, seed: int = 0):
    """Issue #17 item 6: a PD decode server's 8 per-rank logs; rank 5 reaches 620 once, the others stay near
    300. File 0 holds the start-up line."""
    rng = random.Random(seed)
    traffic_lines = traffic(minutes, lambda m, s, d: rng.randint(100, 300))
    at, dp, _ = traffic_lines[len(traffic_lines) // 2 + hot_rank]
    traffic_lines[len(traffic_lines) // 2 + hot_rank] = (at, hot_rank, hot_peak)
    start = LOG.start(T0 - 30, disaggregation_mode="decode")
    files = [list(start) if dp == 0 else [] for dp in range(DP)]
    for at, dp, running in traffic_lines:
        files[dp] += LOG.decode(at, running, rank(dp))
    merged = start + decode_lines(LOG, traffic_lines)
    return files, merged


def test_per_rank_files_give_the_group_peak_in_any_order(tmp_path):
    files, merged = per_rank_logs()
    paths = [write(tmp_path / f"rank{index}.log", lines) for index, lines in enumerate(files)]
    whole = read([write(tmp_path / "merged.log", merged)])
    assert whole.segments[0].history.max_peak_runtime_tokens == 620
    for order in (paths, paths[::-1], paths[3:] + paths[:3]):
        split = read(order)
        assert split.decode_lines == whole.decode_lines == 60 * 30 * DP and split.unplaced_lines == 0
        assert split.segments[0].history.to_dict() == whole.segments[0].history.to_dict()
    # concatenated rank after rank (each file goes back to the start): placed exactly, within 48 h
    concatenated = read([write(tmp_path / "cat.log", [line for lines in files for line in lines])])
    assert concatenated.segments[0].history.to_dict() == whole.segments[0].history.to_dict()


def test_several_files_give_the_same_advice_as_their_merge(tmp_path):
    files, merged = per_rank_logs(minutes=180)
    paths = [write(tmp_path / f"rank{index}.log.gz", lines, gz=index % 2 == 1) for index, lines in enumerate(files)]
    split = advise("--json", "--sglang-log", *paths)
    whole = advise("--json", "--sglang-log", write(tmp_path / "rank0.merged", merged))
    assert split.returncode == whole.returncode == 0, split.stderr + whole.stderr
    split_advice, whole_advice = json.loads(split.stdout), json.loads(whole.stdout)
    assert split_advice["max_peak_runtime_tokens"] == 620 and split_advice["recommended_cap"] >= 620
    for key in ("action", "recommended_cap", "lower_bound", "upper_bound", "sample_count", "current_cap",
                "predicted_overflow_windows_per_day_recommended"):
        assert split_advice[key] == whole_advice[key], key


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), files=st.integers(1, 6), duplicated=st.floats(0, 0.3),
       cut=st.sampled_from(["rank", "rotation", "random"]), gz=st.booleans())
def test_any_split_of_a_log_reads_like_the_log(tmp_path_factory, seed, files, duplicated, cut, gz):
    """Split by rank, by rotation (time), or at random; some lines copied into a second file; files in a random
    order, some gzipped: the same history, every line counted once."""
    rng = random.Random(seed)
    folder = tmp_path_factory.mktemp("split")
    traffic_lines = traffic(20, lambda m, s, d: rng.randint(1, 400))
    start = LOG.start(T0 - 30)
    lines = decode_lines(LOG, traffic_lines)
    whole = read([write(folder / "whole.log", start + lines)])
    parts: list[list[str]] = [[] for _ in range(files)]
    copies = 0
    for index, (line, (_, dp, _)) in enumerate(zip(lines, traffic_lines)):
        owner = (dp % files if cut == "rank" else index * files // len(lines) if cut == "rotation"
                 else rng.randrange(files))
        parts[owner].append(line)
        if files > 1 and rng.random() < duplicated:  # also in the next file, where its time is
            parts[(owner + 1) % files].append(line)
            copies += 1
    for part in parts:
        part.sort(key=lambda line: line[1:20])  # stable: lines of one second keep their order
    parts[rng.randrange(files)][:0] = start
    paths = [write(folder / f"part{index}.log", part, gz=gz and index % 2 == 0) for index, part in enumerate(parts)]
    rng.shuffle(paths)
    result = read(paths)
    assert result.segments[0].history.to_dict() == whole.segments[0].history.to_dict()
    assert result.decode_lines == whole.decode_lines == len(lines)
    assert result.duplicate_lines == copies and result.unplaced_lines == 0


def test_lines_older_than_the_reorder_window_are_named_and_stop_the_advice_when_they_matter(tmp_path):
    """A log concatenated out of order across days: day 1 after day 4. When day 1 holds a peak above everything
    placed, there is no advice but one line naming it (exit 2); when it does not, the advice names the lines."""
    day = 86_400.0
    late = traffic(30, lambda m, s, d: 900 if (m, s, d) == (10, 0, 2) else 50)
    # more than one chunk (4 Mi characters) of day 4: within a chunk, lines are put in order before they are placed
    recent = traffic(60 * 24, lambda m, s, d: 100, start_s=T0 + 3 * day, every_s=6, ranks=2)
    lines = LOG.start(T0 - 30) + decode_lines(LOG, recent) + decode_lines(LOG, late)
    path = write(tmp_path / "cat.log", lines)
    result = read([path])
    assert result.unplaced_lines == len(late) and result.unplaced[0].kind == "late"
    assert result.segments[0].history.max_peak_runtime_tokens == 100
    refused = advise("--sglang-log", path)
    assert refused.returncode == 2 and not refused.stdout, refused.stderr
    assert "could not be placed" in refused.stderr and "900 tokens per rank, above the 100" in refused.stderr
    assert f"{path}, lines stamped 2025-11-30 12:10" in refused.stderr and "give the files separately" in refused.stderr
    # the same late lines below the peak: advised, and named
    calm = LOG.start(T0 - 30) + decode_lines(LOG, recent) + decode_lines(LOG, traffic(30, lambda m, s, d: 50))
    ok = advise("--json", "--sglang-log", write(tmp_path / "calm.log", calm))
    assert ok.returncode == 0, ok.stderr
    read_line = read_description(json.loads(ok.stdout)["reasons"])
    assert f"{len(late):,} line(s) not placed (older than lines before it" in read_line
    assert REORDER_S == 2 * day


def test_the_timeline_holds_at_most_the_reorder_window_however_long_the_log(tmp_path, monkeypatch):
    held = []
    original = Timeline._advance

    def spy(self, index):
        original(self, index)
        held.append(len(self._windows))

    monkeypatch.setattr(Timeline, "_advance", spy)
    four_days = traffic(60 * 24 * 4, lambda m, s, d: 10 + m % 50, every_s=60, ranks=2)
    result = read([write(tmp_path / "long.log", LOG.start(T0 - 30) + decode_lines(LOG, four_days))])
    assert result.segments[0].history.sample_count == 60 * 24 * 4
    assert max(held) <= REORDER_S // 60 + 1


def _with_open_files_limit(soft: int, hard: int):
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit


def test_more_files_than_the_open_files_limit_is_one_line_before_reading(tmp_path):
    """Issue #36 (F24): 25,000 files against ulimit -n 20,000 ended after 72 s with "Too many open files:
    '.../r5496.log'; is the file complete?", naming an innocent file. At a bounded size: 300 files, limit 200."""
    from tests.support.launcher import run_capwatch

    files, _ = per_rank_logs(minutes=2)
    paths = [write(tmp_path / f"r{index}.log", files[index % len(files)]) for index in range(300)]
    refused = run_capwatch("advise", "--sglang-log", *paths, timeout_s=120, preexec_fn=_with_open_files_limit(200, 200))
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "300 log files are read at once" in refused.stderr and "ulimit -Hn" in refused.stderr
    assert "Too many open files" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    # Below the hard limit the soft one is raised: the same files are read.
    raised = run_capwatch("advise", "--json", "--sglang-log", *paths, timeout_s=120,
                          preexec_fn=_with_open_files_limit(200, 4096))
    assert raised.returncode == 0, raised.stderr

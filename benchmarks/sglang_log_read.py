"""Reading SGLang logs for ``capwatch advise --sglang-log``: lines per CPU-second in every log format, and
memory that grows neither with the log's length nor with the number of files.

Each format's log is written from its template (tests/support/sglang_logs.py ``FORMATS``, docs/sglang-logs.md):
a start-up line, then per DP rank (8) a decode line every ~1.5 s, with a prefill line and an HTTP access line
every few decode lines, as a busy server logs. Figures per format: ``lines_per_cpu_s`` (best of a few reads, the
reader alone, per CPU second of this process: one core's work, robust to a shared machine) and
``lines_per_s`` (wall). Goal: >= 500,000 lines per CPU-second on every format. The control beside them:
``floor_lines_per_cpu_s``, the same file only read and its lines counted (what no reader can beat), and
the same log gzipped. Memory: the reading process's peak RSS (VmHWM, a fresh process each) for the log, one 4x
as long, and that one split per rank into 8 files and per rank and rotation into 32.
``python -m benchmarks sglang_log_read [--quick] [--json]``.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import tempfile
import time

from capwatch.sglang_logs.log_file import open_log
from capwatch.sglang_logs.reader import read_logs

from tests.support import launcher
from tests.support import sglang_logs as sg

GOAL_LINES_PER_S = 500_000
T0 = 1_764_504_000.0
RANKS = 8
_PREFILL = ("Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.05, #running-req: 60, "
            "#queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 9500.00")
_ACCESS = 'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
# VmHWM (the process's own peak RSS; ru_maxrss would carry the parent's peak across fork + exec).
_RSS_PROBE = (
    "import sys\n"
    "from capwatch.sglang_logs.reader import read_logs\n"
    "read = read_logs(sys.argv[1:])\n"
    "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')][0]\n"
    "print(read.lines, hwm)\n"
)


def write_log(paths: list[str], lines: int, log: sg.LogFormat, seed: int = 0, rotations: int = 1) -> int:
    """A busy server's log of about ``lines`` lines in ``log``'s format: one file, or (``len(paths) ==
    RANKS * rotations``) each rank's lines in files of their own, rotated ``rotations`` times."""
    rng = random.Random(seed)
    handles = [open(path, "w") for path in paths]
    per_file = max(1, lines // len(handles))  # lines per rank per rotated file
    written = [0] * len(handles)
    try:
        handles[0].write("\n".join(log.start(T0 - 60)) + "\n")
        total = 1
        at, step = T0, 0
        batches: list[list[str]] = [[] for _ in handles]
        while total < lines:
            step += 1
            at += 1.5 / RANKS
            dp = step % RANKS
            rank = sg.Rank(dp=dp, tp=dp, ep=dp)
            running = int(60 + 40 * rng.random())
            record = log.decode(at, running, rank, num_used=running * 700, usage=0.05)
            if step % 6 == 0:
                record += log.record(at, [_PREFILL], rank)
            if step % 9 == 0:
                record += log.record(at, [_ACCESS])
            target = 0 if len(handles) == 1 else dp * rotations + min(rotations - 1, written[dp] // per_file)
            batches[target] += record
            written[dp if len(handles) > 1 else 0] += len(record)
            total += len(record)
            if len(batches[target]) >= 4096:
                handles[target].write("\n".join(batches[target]) + "\n")
                batches[target].clear()
        for handle, batch in zip(handles, batches):
            if batch:
                handle.write("\n".join(batch) + "\n")
    finally:
        for handle in handles:
            handle.close()
    return total


def _best_rate(paths: list[str], repeats: int) -> tuple[float, float, int]:
    """(lines per wall second, lines per CPU second of this process, lines)."""
    best_wall = best_cpu = float("inf")
    lines = 0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        read = read_logs(paths)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        lines = read.lines
    return lines / best_wall, lines / best_cpu, lines


def _floor_rate(path: str, repeats: int) -> float:
    """Lines per CPU second to read the file and count its lines: the reader's floor."""
    best = float("inf")
    lines = 0
    for _ in range(repeats):
        cpu = time.process_time()
        raw, content = open_log(path)
        with raw, content:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: content.read(1 << 22), b""))
        best = min(best, time.process_time() - cpu)
    return lines / best


def _peak_rss_mib(paths: list[str]) -> float:
    measured = launcher.run("-c", _RSS_PROBE, *paths, timeout_s=1800)
    if measured.returncode != 0:
        raise RuntimeError(f"the peak-RSS probe failed: {measured.stderr[-2000:]}")
    return round(int(measured.stdout.split()[1]) / 1024, 1)


def run(quick: bool = False) -> dict:
    lines = 150_000 if quick else 1_000_000
    repeats = 3 if quick else 5
    formats: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="capwatch-sglang-log-") as folder:
        for log in sg.FORMATS:
            path = os.path.join(folder, f"{log.name}.log")
            write_log([path], lines, log)
            wall_rate, cpu_rate, read_lines = _best_rate([path], repeats)
            formats[log.name] = {"lines": read_lines, "bytes_per_line": round(os.path.getsize(path) / read_lines),
                                 "lines_per_cpu_s": int(cpu_rate), "lines_per_s": int(wall_rate),
                                 "meets_goal": cpu_rate >= GOAL_LINES_PER_S}
            if log is not sg.FORMATS[0]:
                os.unlink(path)
        plain = os.path.join(folder, f"{sg.FORMATS[0].name}.log")
        packed = plain + ".1.gz"
        with open(plain, "rb") as source, gzip.open(packed, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)
        _, gz_rate, _ = _best_rate([packed], repeats)
        floor = _floor_rate(plain, repeats)
        long = os.path.join(folder, "long.log")
        write_log([long], 4 * lines, sg.FORMATS[0], seed=1)
        per_rank = [os.path.join(folder, f"rank{index}.log") for index in range(RANKS)]
        write_log(per_rank, 4 * lines, sg.FORMATS[0], seed=1)
        rotated = [os.path.join(folder, f"rank{index // 4}.log.{index % 4}") for index in range(RANKS * 4)]
        write_log(rotated, 4 * lines, sg.FORMATS[0], seed=1, rotations=4)
        memory = {"log": {"files": 1, "lines": lines, "peak_rss_mib": _peak_rss_mib([plain])},
                  "4x as long": {"files": 1, "lines": 4 * lines, "peak_rss_mib": _peak_rss_mib([long])},
                  "4x, per rank": {"files": RANKS, "lines": 4 * lines, "peak_rss_mib": _peak_rss_mib(per_rank)},
                  "4x, per rank and rotated": {"files": len(rotated), "lines": 4 * lines,
                                               "peak_rss_mib": _peak_rss_mib(rotated)}}
    slowest = min(formats, key=lambda name: formats[name]["lines_per_cpu_s"])
    return {
        "goal_lines_per_cpu_s": GOAL_LINES_PER_S,
        "slowest_format": slowest,
        "slowest_lines_per_cpu_s": formats[slowest]["lines_per_cpu_s"],
        "meets_goal_on_every_format": all(row["meets_goal"] for row in formats.values()),
        "gz_lines_per_cpu_s": int(gz_rate),
        "floor_lines_per_cpu_s": int(floor),
        "formats": formats,
        "memory": memory,
    }


if __name__ == "__main__":
    from benchmarks.standalone import standalone

    standalone("python -m benchmarks.sglang_log_read", __doc__, run)

"""What a user hits in the first hour with the command line (issue #31, symptom 8): ``--version``, a pipe
closed early, logs from standard input and from pipes. Each runs ``python -m capwatch`` as a user does."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.sglang_logs.logs import T0, decode_lines, traffic
from tests.support import launcher
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]


def log_text(minutes: int = 60) -> str:
    return "\n".join(LOG.start(T0 - 30) + decode_lines(LOG, traffic(minutes, lambda m, s, d: 40 + (m % 30) + d))) + "\n"


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    result = launcher.run_capwatch("--version", timeout_s=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"capwatch {version('a2a-capwatch')}"


def test_version_has_one_source():
    from importlib.metadata import version

    from capwatch.version import capwatch_version

    assert capwatch_version() == version("a2a-capwatch")


def test_a_pipe_closed_early_ends_quietly(tmp_path):
    """`capwatch plan ... --json | head -1` printed a BrokenPipeError traceback."""
    command = (f"cd {tmp_path} && {launcher.PYTHON} -m capwatch plan --model deepseek-v3 --ep-size 8 "
               "--cap 128:524288:128 --json 2>capwatch.err | head -1 >/dev/null; echo ${PIPESTATUS[0]}")
    completed = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                               env=launcher.environment(), cwd=launcher.outside_checkout(tmp_path))
    status = int(completed.stdout.strip())
    errors = (tmp_path / "capwatch.err").read_text()
    assert errors == "", errors
    assert status == 141  # as a program SIGPIPE ends (docs/cli.md, exit codes)


def test_a_log_from_standard_input(tmp_path):
    """`kubectl logs ... | capwatch advise --sglang-log -` was refused ("not a readable file")."""
    text = log_text()
    path = tmp_path / "server.log"
    path.write_text(text)
    from_file = launcher.run_capwatch("advise", "--json", "--sglang-log", str(path), timeout_s=120)
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = launcher.run_capwatch("advise", "--json", "--sglang-log", "-", input=text, timeout_s=120)
    assert from_stdin.returncode == 0, from_stdin.stderr
    advice, piped = json.loads(from_file.stdout), json.loads(from_stdin.stdout)
    assert piped["cluster"] == "stdin"
    assert {**piped, "cluster": "server"} == advice  # the same lines give the same advice
    gz = launcher.run_capwatch("advise", "--json", "--sglang-log", "-", input=__import__("gzip").compress(
        text.encode()), text=False, timeout_s=120)
    assert gz.returncode == 0, gz.stderr
    assert json.loads(gz.stdout)["recommended_cap"] == advice["recommended_cap"]


@pytest.mark.parametrize("name", ["/dev/stdin", "fifo"])
def test_a_log_from_a_pipe(tmp_path, name):
    """/dev/stdin and a named pipe (as `<(zcat log.gz)` gives) were refused ("not a readable file")."""
    text = log_text()
    if name == "/dev/stdin":
        result = launcher.run_capwatch("advise", "--json", "--sglang-log", "/dev/stdin", input=text, timeout_s=120)
    else:
        fifo = tmp_path / "log.fifo"
        os.mkfifo(fifo)
        process = launcher.start("-m", "capwatch", "advise", "--json", "--sglang-log", str(fifo),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with open(fifo, "w") as writer:
            writer.write(text)
        out, err = process.communicate(timeout=120)
        result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sample_count"] > 0


def test_standard_input_from_a_terminal_or_twice_is_one_line():
    twice = launcher.run_capwatch("advise", "--sglang-log", "-", "-", input="", timeout_s=60)
    assert twice.returncode == 2 and "more than once" in twice.stderr and "Traceback" not in twice.stderr


def test_serve_says_the_url_it_listens_on(tmp_path):
    """`capwatch serve` never printed the URL it listens on."""
    import re
    import urllib.request

    from tests.support.service import free_port

    port = free_port()
    process = launcher.start("-m", "capwatch", "serve", "--port", str(port), "--db", str(tmp_path / "capwatch.db"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             start_new_session=True)
    try:
        said = ""
        for _ in range(200):
            line = process.stderr.readline()
            if not line or "listening on" in line:
                said = line
                break
        match = re.search(r"listening on (http://\S+/)", said)
        assert match, said
        assert match.group(1) == f"http://127.0.0.1:{port}/"
        with urllib.request.urlopen(match.group(1) + "healthz", timeout=30) as answer:
            assert answer.status == 200
    finally:
        process.terminate()
        process.wait(timeout=30)

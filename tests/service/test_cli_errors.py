"""Mistakes on the ``capwatch serve`` / ``advise`` command line, run as real processes: exit 2, one
line naming the flag or variable, no traceback, and nothing created (no database file)."""

from __future__ import annotations

import socket
import subprocess

import pytest
from capwatch.service.config import Settings
from pydantic import ValidationError

from capwatch import cli, usage_errors
from tests.support.checkout import REPO_ROOT
from tests.support.launcher import run_capwatch
from tests.support.service import free_port


def capwatch(cwd, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_capwatch(*args, cwd=cwd, env={"PATH": "/usr/bin:/bin", **(env or {})}, inherit_env=False, timeout_s=60)


def assert_one_line_usage_error(result: subprocess.CompletedProcess, command: str, *names: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"capwatch {command}: error: "), result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    assert "errors.pydantic.dev" not in lines[0]
    return lines[0]


@pytest.mark.parametrize(("args", "env", "names"), [
    (["serve", "--port", "70000"], {}, ["--port", "65535"]),
    (["serve", "--port", "http"], {}, ["--port", "expected a port number"]),
    (["serve", "--token", ""], {}, ["--token", "empty"]),
    (["serve"], {"CAPWATCH_TOKEN": ""}, ["CAPWATCH_TOKEN", "empty"]),
    (["serve", "--db", "/"], {}, ["--db", "directory"]),
    (["serve", "--db", "/proc/version"], {}, ["--db", "/proc/version"]),
    (["serve", "--db", "no/such/dir/capwatch.db"], {}, ["--db", "does not exist"]),
    (["serve"], {"CAPWATCH_DB_PATH": "/"}, ["CAPWATCH_DB_PATH", "directory"]),
    (["serve"], {"CAPWATCH_ADVISOR__MIN_SAMPLES": "abc"}, ["CAPWATCH_ADVISOR__MIN_SAMPLES", "'abc'"]),
    (["serve"], {"CAPWATCH_ADVISOR__MAX_CAP": "64"}, ["CAPWATCH_ADVISOR", "max_cap 64 is below the alignment 128"]),
    (["serve"], {"CAPWATCH_ADVISOR__MIN_CAP": "4096", "CAPWATCH_ADVISOR__MAX_CAP": "1024"},
     ["CAPWATCH_ADVISOR", "min_cap 4096 is above max_cap 1024"]),
    (["serve"], {"CAPWATCH_PORT": "70000"}, ["CAPWATCH_PORT"]),
    (["serve", "--prometheus-url", "notaurl"], {}, ["--prometheus-url", "'notaurl'"]),
    (["serve"], {"CAPWATCH_PROMETHEUS_URL": "ftp://x"}, ["CAPWATCH_PROMETHEUS_URL"]),
    (["serve", "--host", "no.such.host.invalid"], {}, ["--host"]),
    # Issue #20, finding 5: finite but harmful settings, and a URL or token no request can carry.
    (["serve"], {"CAPWATCH_WINDOW_S": "1e-300"}, ["CAPWATCH_WINDOW_S", "greater than or equal to 1"]),
    (["serve"], {"CAPWATCH_BODY_TIMEOUT_S": "1e-300"}, ["CAPWATCH_BODY_TIMEOUT_S"]),
    (["serve"], {"CAPWATCH_BODY_TIMEOUT_S": "1", "CAPWATCH_BODY_GRACE_S": "2"},
     ["settings: CAPWATCH_BODY_GRACE_S 2 is not below CAPWATCH_BODY_TIMEOUT_S 1"]),
    (["serve"], {"CAPWATCH_SEND_TIMEOUT_S": "1e9"}, ["CAPWATCH_SEND_TIMEOUT_S", "300"]),
    (["serve"], {"CAPWATCH_HEADER_TIMEOUT_S": "0"}, ["CAPWATCH_HEADER_TIMEOUT_S"]),
    (["serve"], {"CAPWATCH_MAX_CONNECTIONS": "2"}, ["CAPWATCH_MAX_CONNECTIONS", "16"]),
    (["serve"], {"CAPWATCH_ADVISOR__HALF_LIFE_S": "1e-300"}, ["CAPWATCH_ADVISOR__HALF_LIFE_S"]),
    (["serve"], {"CAPWATCH_ADVISOR__MAX_CAP": "2000000"}, ["CAPWATCH_ADVISOR__MAX_CAP", "1048576"]),
    (["serve"], {"CAPWATCH_STALE_AFTER_S": "600", "CAPWATCH_MISSING_AFTER_S": "60"},
     ["settings: CAPWATCH_MISSING_AFTER_S 60 is below CAPWATCH_STALE_AFTER_S 600"]),
    (["serve"], {"CAPWATCH_READS_NEED_TOKEN": "true"}, ["CAPWATCH_READS_NEED_TOKEN needs a token"]),
    (["serve", "--token", "s3cret\r\nX-Evil: 1"], {}, ["--token", "Authorization header"]),
    (["serve"], {"CAPWATCH_PROMETHEUS_URL": "http://prometheus:abc"}, ["CAPWATCH_PROMETHEUS_URL", "port 'abc'"]),
])
def test_serve_mistakes_are_one_line_and_create_nothing(tmp_path, args, env, names):
    before = set(tmp_path.iterdir())
    assert_one_line_usage_error(capwatch(tmp_path, *args, env=env), "serve", *names)
    assert set(tmp_path.iterdir()) == before  # no capwatch.db in the working directory


def test_serve_on_a_port_in_use_fails_before_creating_the_database(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = capwatch(tmp_path, "serve", "--port", str(port), "--db", str(tmp_path / "new.db"))
    assert_one_line_usage_error(result, "serve", "--port", str(port), "in use")
    assert not list(tmp_path.iterdir())


def test_advise_mistakes_name_the_flag(tmp_path):
    line = assert_one_line_usage_error(capwatch(tmp_path, "advise", "--timeout", "-1"), "advise", "--timeout")
    assert "0.1..3600" in line
    assert_one_line_usage_error(capwatch(tmp_path, "advise", "--timeout", "1e300"), "advise", "--timeout", "0.1..3600")
    assert_one_line_usage_error(capwatch(tmp_path, "advise", "--timeout", "soon"), "advise", "--timeout")
    assert_one_line_usage_error(capwatch(tmp_path, "advise", "--url", "localhost:8321"), "advise", "--url")
    down = capwatch(tmp_path, "advise", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert_one_line_usage_error(down, "advise", "cannot reach")


def test_an_empty_token_is_refused_by_the_settings(monkeypatch):
    for token in ("", "   "):
        with pytest.raises(ValidationError, match="token is empty"):
            Settings(token=token)
    monkeypatch.setenv("CAPWATCH_TOKEN", "")
    with pytest.raises(ValidationError, match="token is empty"):
        Settings()
    monkeypatch.setenv("CAPWATCH_TOKEN", "s3cret")
    assert Settings().token.get_secret_value() == "s3cret"


def test_a_bug_is_not_dressed_up_as_a_usage_error(monkeypatch):
    """Only CommandError, SizingError and pydantic's ValidationError are usage errors; any other
    ValueError is a bug and keeps its traceback."""
    from capwatch.commands import advise

    def broken(*_args, **_kwargs):
        raise ValueError("a programming mistake")

    monkeypatch.setattr(advise, "fetch_advice", broken)
    with pytest.raises(ValueError, match="a programming mistake"):
        cli.main(["advise"])
    from capwatch.sizing.checks import SizingError

    assert usage_errors.usage_error(SizingError("--cap must be positive")) == "--cap must be positive"
    assert usage_errors.usage_error(ValueError("bug")) is None and usage_errors.usage_error(KeyError("bug")) is None
    with pytest.raises(ValidationError) as caught:
        Settings(port=-1, window_s=0)
    line = usage_errors.usage_error(caught.value)
    assert "\n" not in line and "port:" in line and "window_s:" in line


def test_the_commands_import_their_error_at_the_top_and_never_the_cli():
    """``CommandError`` lives in ``capwatch.usage_errors`` (which imports nothing of capwatch): every
    module raising it imports it once, at the top, and only ``python -m capwatch`` imports the CLI."""
    import ast

    package = REPO_ROOT / "capwatch"
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = set(tree.body)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("capwatch"):
                continue
            where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            assert node.module != "capwatch.cli" or path.name == "__main__.py", f"{where} imports the CLI"
            if node.module == "capwatch.usage_errors":
                assert node in top_level, f"{where} imports CommandError inside a function"
    own = ast.parse((package / "usage_errors.py").read_text())
    assert not [node for node in ast.walk(own) if isinstance(node, ast.ImportFrom) and "capwatch" in (node.module or "")]


def _read_only(folder) -> None:
    """A folder this user cannot create files in: chattr +i as root (root writes through 0555), else 0555."""
    import os

    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("root here cannot make a folder read-only (no chattr +i on this file system)")
    else:
        folder.chmod(0o555)


def _writable(folder) -> None:
    import os

    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


def test_a_database_in_a_read_only_folder_is_said_to_be_that_not_damaged(tmp_path):
    """Issue #20, finding 8: an intact database in a read-only folder was reported as damaged, with the advice to
    move it aside (to start with an empty one): data thrown away for a permission."""
    import hashlib
    import sqlite3

    folder = tmp_path / "state"
    folder.mkdir()
    database = folder / "capwatch.db"
    connection = sqlite3.connect(database, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE kept (value)")
    connection.execute("INSERT INTO kept VALUES (1)")
    connection.close()  # the last connection: the WAL is checkpointed and its two files removed
    before = hashlib.sha256(database.read_bytes()).hexdigest()
    _read_only(folder)
    try:
        result = capwatch(tmp_path, "serve", "--db", str(database), "--port", str(free_port()))
    finally:
        _writable(folder)
    line = assert_one_line_usage_error(result, "serve", "--db", f"its folder {folder} is not writable",
                                       "capwatch.db-wal", "the database was not touched")
    assert "damaged" not in line and "move it aside" not in line
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    assert sorted(path.name for path in folder.iterdir()) == ["capwatch.db"]

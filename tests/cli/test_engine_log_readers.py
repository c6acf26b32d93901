"""`capwatch advise` takes its offline options from each engine's log reader (``LOG_READER`` in the engine's home,
found through ``capwatch.engines``), not from a list of its own: a second engine's reader adds its option group and
gets its own files, the first's keeps working exactly (tests/sglang_logs/test_cli.py runs it as a user does)."""

from __future__ import annotations

import argparse
import importlib
import json
import types

import pytest
from capwatch import cli
from capwatch.commands import advise
from capwatch.engines import ENGINES


def test_every_engine_names_a_log_reader_that_adds_its_option_group(capsys):
    readers = advise.log_readers()
    assert [reader.__name__ for reader in readers] == [engine.LOG_READER for engine in ENGINES.values()]
    with pytest.raises(SystemExit):
        cli.main(["advise", "--help"])
    shown = capsys.readouterr().out
    for reader in readers:
        assert reader.OPTION in shown and reader.ALTERNATIVE in " ".join(shown.split())
        assert all("--" + flag.replace("_", "-") in shown for flag in reader.SERVER_FLAGS)


def other_engine_reader(calls: list) -> types.ModuleType:
    """An engine capwatch does not ship (no second one exists yet): its log option, one flag of its own, a reader
    that records what it was given and answers an advice object."""
    reader = types.ModuleType("other_engine_logs")
    reader.OPTION, reader.DEST, reader.SERVER_FLAGS = "--other-log", "other_log", ("other_window",)
    reader.ALTERNATIVE, reader.PROGRESS_LABEL, reader.STDIN = "with --other-log, advise from Other's logs", "", "-"

    def add_options(parser: argparse.ArgumentParser, flag_types) -> None:
        group = parser.add_argument_group("advice from Other logs")
        group.add_argument(reader.OPTION, dest=reader.DEST, nargs="+", metavar="FILE")
        group.add_argument("--other-window", type=flag_types["cap"])

    class OtherLogError(ValueError):
        pass

    def advise_logs(paths, flags, cluster, progress=None):
        calls.append((paths, flags, cluster))
        if paths == ["bad"]:
            raise OtherLogError("no Other lines in bad")
        return types.SimpleNamespace(advice=types.SimpleNamespace(model_dump=lambda mode: {"cluster": cluster}))

    reader.add_options = add_options
    reader.path_problem = lambda paths: None
    reader.load_reader = lambda: (advise_logs, OtherLogError)
    return reader


def test_a_second_engines_reader_adds_its_options_and_reads_its_own_files(monkeypatch, capsys):
    calls: list = []
    first = importlib.import_module(next(iter(ENGINES.values())).LOG_READER)
    monkeypatch.setattr(advise, "log_readers", lambda: (first, other_engine_reader(calls)))

    assert cli.main(["advise", "--other-log", "a.log", "b.log", "--other-window", "64", "--cluster", "g",
                     "--json"]) == 0
    assert calls == [(["a.log", "b.log"], {"other_window": 64}, "g")]
    assert json.loads(capsys.readouterr().out) == {"cluster": "g"}

    assert cli.main(["advise", "--other-log", "bad"]) == 2  # its reader's error: one line, the command's exit
    assert capsys.readouterr().err.strip() == "capwatch advise: error: no Other lines in bad"
    assert cli.main(["advise", "--other-window", "64"]) == 2  # its flags go with its option only
    assert "--other-window go(es) with --other-log" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the command's converter checks the reader's flag
        cli.main(["advise", "--other-window", "0"])
    assert "argument --other-window: expected a cap in 1.." in capsys.readouterr().err
    assert cli.main(["advise", first.OPTION, "/nonexistent"]) == 2  # the first reader is untouched
    assert "is not a readable file" in capsys.readouterr().err and len(calls) == 2

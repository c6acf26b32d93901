"""The rank zygote (``rank_zygote.py``, ``zygotes.py``): what the import read decides which ranks it may fork,
and a forked child is its request — arguments, environment with what the import wrote, working folder, log,
exit code, kill — in the main venv, with ``zygote_probe.py`` as the first import in place of sglang's."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.sglang.rank_zygote import EnvironmentReads
from tests.sglang.zygotes import Zygote
from tests.support import launcher

PROBE = "tests.sglang.zygote_probe"


def test_reads_by_name_are_recorded_with_their_value_and_scans_are_not(monkeypatch):
    monkeypatch.setenv("CAPWATCH_TEST_A", "1")
    monkeypatch.setenv("CAPWATCH_TEST_SCANNED", "2")
    for absent in ("CAPWATCH_TEST_B", "CAPWATCH_TEST_C"):  # set, then deleted: removed again after the test
        monkeypatch.setenv(absent, "")
        monkeypatch.delenv(absent)
    with EnvironmentReads() as reads:
        dict(os.environ), os.environ.copy(), list(os.environ.items())  # scans, as fsspec and tqdm do
        for _ in os.environ:  # a scan that reads nothing
            pass
        assert os.environ.get("CAPWATCH_TEST_A") == "1"
        assert "CAPWATCH_TEST_B" not in os.environ
        os.environ.setdefault("CAPWATCH_TEST_C", "written")
    assert reads.values == {"CAPWATCH_TEST_A": "1", "CAPWATCH_TEST_B": None, "CAPWATCH_TEST_C": None}
    os.environ.get("CAPWATCH_TEST_SCANNED")  # uninstalled: nothing more is recorded
    assert "CAPWATCH_TEST_SCANNED" not in reads.values


def _variables(**variables: str) -> dict[str, str]:
    return {"CAPWATCH_TEST_READ_AT_IMPORT": "zygote", **variables}


def _environment(**variables: str) -> dict[str, str]:
    """The whole environment a child with these variables gets (as ``zygotes.start_rank`` compares it)."""
    return launcher.environment(_variables(**variables), imports_tests=True)


@pytest.fixture
def zygote():
    started = Zygote(launcher.PYTHON, (), _variables(CAPWATCH_TEST_RUN="first"), ready_timeout_s=60,
                     first_import=PROBE)
    yield started
    started.stop()


def test_only_what_the_import_did_not_read_may_differ(zygote):
    assert zygote.accepts(_environment(CAPWATCH_TEST_RUN="another"))  # scanned at import, never read by name
    assert not zygote.accepts(_environment(CAPWATCH_TEST_RUN="first", CAPWATCH_TEST_READ_AT_IMPORT="other"))
    assert not zygote.accepts(_environment(CAPWATCH_TEST_RUN="first", CAPWATCH_TEST_WRITTEN_AT_IMPORT="x"))
    assert not zygote.accepts({**_environment(CAPWATCH_TEST_RUN="first"), "OMP_NUM_THREADS": "1"})  # not a test's
    another_path = launcher.environment(_variables(CAPWATCH_TEST_RUN="first"), imports_tests=True,
                                        path_first=["/another/release"])
    assert not zygote.accepts(another_path)
    assert zygote.reads["CAPWATCH_TEST_READ_AT_IMPORT"] == "zygote"
    assert "CAPWATCH_TEST_RUN" not in zygote.reads


def test_a_forked_child_is_its_request_with_what_the_import_wrote(zygote, tmp_path):
    environment = _environment(CAPWATCH_TEST_RUN="second")
    child = zygote.fork(PROBE, ["3"], environment, launcher.outside_checkout(tmp_path), tmp_path / "child.log")
    assert child.wait(timeout=60) == 3 and child.poll() == 3
    said = json.loads((tmp_path / "child.log").read_text().splitlines()[-1])
    assert said == {"argv": ["3"], "cwd": str(tmp_path), "import_saw": "zygote",
                    "env": {"CAPWATCH_TEST_READ_AT_IMPORT": "zygote", "CAPWATCH_TEST_RUN": "second",
                            "CAPWATCH_TEST_WRITTEN_AT_IMPORT": "by the import"}}


def test_a_killed_child_reports_the_signal_as_subprocess_does(zygote, tmp_path):
    child = zygote.fork(PROBE, ["sleep"], _environment(), tmp_path, tmp_path / "child.log")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.kill()
    assert child.wait(timeout=60) == -9


def test_a_stopped_zygote_takes_the_ranks_it_still_has_with_it(tmp_path):
    zygote = Zygote(launcher.PYTHON, (), _variables(), ready_timeout_s=60, first_import=PROBE)
    child = zygote.fork(PROBE, ["sleep"], _environment(), tmp_path, tmp_path / "child.log")
    zygote.stop()
    deadline = time.monotonic() + 30
    while _running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child.pid)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

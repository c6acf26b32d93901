"""The launcher-to-scheduler record of what capwatch applied (sglang_plugin/apply/applied.py), main venv."""

from __future__ import annotations

import json
import logging
import pytest
from capwatch.sglang_plugin.apply.applied import Applied, clear_applied, key, read_applied, record_applied
from hypothesis import given
from hypothesis import strategies as st

from tests.support import launcher

FLASHINFER = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
DEEPEP = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def test_a_record_reads_back_and_each_variable_has_its_own():
    environ = {}
    record_applied(FLASHINFER, 1280, "capwatch", 7, "advice revision 7: raise, p99.9 1100 tokens", environ)
    record_applied(DEEPEP, None, "default", None, "unset: SGLang's default", environ)
    assert read_applied(FLASHINFER, environ) == Applied(1280, "capwatch", 7, "advice revision 7: raise, p99.9 1100 tokens")
    assert read_applied(DEEPEP, environ) == Applied(None, "default", None, "unset: SGLang's default")
    assert set(environ) == {f"CAPWATCH_APPLIED_{FLASHINFER}", f"CAPWATCH_APPLIED_{DEEPEP}"}
    clear_applied(FLASHINFER, environ)
    assert read_applied(FLASHINFER, environ) is None and read_applied(DEEPEP, environ) is not None


def test_a_child_process_inherits_the_record():
    environ = {}
    record_applied(FLASHINFER, 2048, "operator", None, "set by the operator; CAPWATCH_APPLY=on keeps it", environ)
    program = ("from capwatch.sglang_plugin.apply.applied import read_applied; "
               f"a = read_applied({FLASHINFER!r}); print(a.cap, a.source, a.revision)")
    out = launcher.run("-c", program, env=environ, timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2048", "operator", "None"]


@pytest.mark.parametrize("cap, source, revision, message", [
    (1024, "advice", 3, "source 'advice'"),
    (0, "capwatch", 3, "cap 0"),
    (-128, "operator", None, "cap -128"),
    (True, "operator", None, "cap True"),
    (1024, "capwatch", None, "revision"),
    (None, "capwatch", 4, "a value"),
    (1024, "capwatch", -1, "revision -1"),
])
def test_a_bad_record_is_refused_and_nothing_is_set(cap, source, revision, message):
    environ = {}
    with pytest.raises(ValueError, match=message):
        record_applied(FLASHINFER, cap, source, revision, "why", environ)
    assert environ == {}


def test_a_bad_variable_name_is_refused():
    with pytest.raises(ValueError, match="not a cap variable name"):
        key("sglang cap")


@pytest.mark.parametrize("raw", ["", "1280", "{}", "[1, 2]", '{"cap": 1, "source": "capwatch"}',
                                 '{"cap": "many", "source": "operator", "revision": null, "reason": ""}',
                                 '{"cap": 1, "source": "nobody", "revision": null, "reason": ""}'])
def test_an_unreadable_record_is_none_with_one_warning(raw, caplog):
    with caplog.at_level(logging.WARNING, logger="capwatch.sglang"):
        assert read_applied(FLASHINFER, {key(FLASHINFER): raw}) is None
    assert len(caplog.records) == 1 and key(FLASHINFER) in caplog.records[0].getMessage()


@given(reason=st.text(max_size=2000), cap=st.integers(1, 1 << 40), revision=st.integers(0, 1 << 40))
def test_any_reason_round_trips_on_one_bounded_line(reason, cap, revision):
    environ = {}
    applied = record_applied(FLASHINFER, cap, "capwatch", revision, reason, environ)
    assert read_applied(FLASHINFER, environ) == applied
    assert "\n" not in applied.reason and len(applied.reason) <= 500
    assert json.loads(environ[key(FLASHINFER)])["cap"] == cap

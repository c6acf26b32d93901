"""The cap guards hold under ``python -O`` (which strips every ``assert``), in real ranks."""

from __future__ import annotations

import json

from capwatch.backends.flashinfer import RULES as FLASHINFER

from tests.support import launcher


def test_guards_raise_and_count_under_python_dash_o():
    completed = launcher.run("-O", "-m", "tests.dispatcher.rank_functions", imports_tests=True, timeout_s=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["parent_optimize"] == 1
    for rank in report["ranks"]:
        assert rank["optimize"] == 1
        assert "needs 6 tokens" in rank["over_cap_message"] and f"{FLASHINFER.cap_env_var}=128" in rank["over_cap_message"]
        assert rank["over_cap_counted"] == 1
        assert "3 local tokens" in rank["local_message"] and rank["local_counted"] == 1

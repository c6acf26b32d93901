"""SGLang 0.5.23 where deep_ep does not import (DeepEP not installed, as in this venv): SGLang itself cannot build its
DeepEPDispatcher, and the plugin says so as ``backend_unavailable`` (its info metric and its one start line: what is
missing, what to do), not as ``disabled``. Two gloo ranks of the released 0.5.23 code, no DeepEP stand-in; the
backends whose library SGLang imports by name (pplx, Mooncake EP, MoRI) say the same through the same helper."""

from __future__ import annotations

import pytest
from capwatch.sglang_plugin.hooks import BACKENDS
from capwatch.sglang_plugin.status import BackendUnavailable
from tests.sglang.ranks import RankRun
from tests.sglang.releases import RELEASES
from tests.sglang.test_deepep_dispatcher import MODEL, WORLD
from tests.support.ports import free_port_block

NEWEST = RELEASES[-1]


def test_deepep_that_does_not_import_is_backend_unavailable(tmp_path):
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    run = RankRun(tmp_path, WORLD, {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": "unavailable",
                                    "CAPWATCH_METRICS_BASE_PORT": str(base_port)},
                  sglang_release=NEWEST, metrics_base_port=base_port, program="tests.sglang.deepep_rank_program")
    run.start({"plugins": True, "unbuildable": True, "deepep_model": MODEL,
               "deepep_mode": "low_latency", "layers": [1], "steps": []})
    run.wait_ready()
    try:
        for rank in range(WORLD):
            # SGLang's own constructor refuses, as it would without capwatch.
            assert (tmp_path / f"build-error-{rank}").read_text().startswith(
                "ImportError: DeepEP is not available"), run.logs()
            infos = [dict(labels) for (name, labels), _ in run.metrics(rank).items()
                     if name == "capwatch_sglang_plugin_info"]
            assert [info["state"] for info in infos] == ["backend_unavailable"], infos
            reason = infos[0]["reason"]
            assert reason.startswith(f"sglang {NEWEST}'s DeepEPDispatcher cannot be built: deep_ep does not import "
                                     "(ModuleNotFoundError: No module named 'deep_ep')"), reason
            assert "; install DeepEP" in reason, reason
            assert not any(name.startswith("moe_a2a_") for name, _ in run.metrics(rank))
            lines = [line for line in run.log(rank).splitlines() if "capwatch:" in line]
            assert len(lines) == 1 and "capwatch: backend unavailable: " in lines[0], lines
    finally:
        assert run.release() == [0, 0], run.logs()


@pytest.mark.parametrize("backend", ["pplx", "mooncake", "mori"])
def test_a_library_that_does_not_import_is_backend_unavailable(backend, monkeypatch):
    hook = BACKENDS[backend]
    monkeypatch.setattr(hook, "LIBRARY", "capwatch_no_such_library")
    found = hook.problem(hook.ADAPTERS[NEWEST], None, False)
    assert isinstance(found, BackendUnavailable), found
    assert "cannot be built: capwatch_no_such_library does not import (ModuleNotFoundError: " in found.installed
    assert found.remedy.startswith("install ") and "pick another --moe-a2a-backend" in found.remedy

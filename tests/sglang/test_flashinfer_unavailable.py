"""SGLang 0.5.23 beside the real flashinfer-python 0.7.4 (no ``flashinfer.comm.MoeAlltoAll``): SGLang itself cannot
build its FlashinferDispatcher, and the plugin says so as ``backend_unavailable`` (its info metric and its one start
line: what is installed, what to do), not as a capwatch adapter that broke. Two gloo ranks of the released 0.5.23 code
with the 0.7.4 wheel's folder first on the path (``tests/sglang/releases.py``)."""

from __future__ import annotations

from tests.sglang.ranks import RankRun
from tests.sglang.releases import FLASHINFER_WITHOUT_MOE_ALLTOALL, FOLDER, RELEASES
from tests.support.ports import free_port_block

NEWEST = RELEASES[-1]
FLASHINFER = FLASHINFER_WITHOUT_MOE_ALLTOALL.split("==")[1]
PLAN = {"target_layers": [1], "steps": [], "unbuildable": True}


def test_flashinfer_without_moe_alltoall_is_backend_unavailable(tmp_path):
    folder = FOLDER / FLASHINFER_WITHOUT_MOE_ALLTOALL
    # The folder holds the released wheel, not a stand-in: its own dist-info and no MoeAlltoAll in flashinfer.comm.
    assert (folder / f"flashinfer_python-{FLASHINFER}.dist-info").is_dir()
    assert "MoeAlltoAll" not in (folder / "flashinfer" / "comm" / "__init__.py").read_text()
    base_port = free_port_block(2)  # rank r exports on base + r
    run = RankRun(tmp_path, 2, {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": "unavailable",
                                "CAPWATCH_METRICS_BASE_PORT": str(base_port)},
                  sglang_release=NEWEST, extra_path=(folder,), metrics_base_port=base_port)
    run.start(PLAN)
    run.wait_ready()
    try:
        for rank in range(run.world):
            # SGLang's own constructor refuses, as it would without capwatch.
            assert (tmp_path / f"build-error-{rank}").read_text().startswith(
                "ImportError: Flashinfer is not installed or does not support A2A"), run.logs()
            infos = {dict(labels)["state"]: dict(labels) for (name, labels), _ in run.metrics(rank).items()
                     if name == "capwatch_sglang_plugin_info"}
            assert list(infos) == ["backend_unavailable"], infos
            info = infos["backend_unavailable"]
            assert info["sglang_version"] == NEWEST and info["flashinfer_version"] == FLASHINFER
            assert f"with flashinfer-python {FLASHINFER}" in info["reason"]
            assert "flashinfer.comm.MoeAlltoAll" in info["reason"]
            assert "install flashinfer-python 0.7.2.post1" in info["reason"], info["reason"]
            assert not any(name.startswith("moe_a2a_") for name, _ in run.metrics(rank))
            lines = [line for line in run.log(rank).splitlines() if "capwatch:" in line]
            assert len(lines) == 1 and "capwatch: backend unavailable: " in lines[0], lines
            assert "capwatch: disabled" not in run.log(rank)
    finally:
        assert run.release() == [0, 0], run.logs()

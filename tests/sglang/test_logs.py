"""The log reader against SGLang's own logging and rules, on each verified release (its released wheel, in
.venv-sglang with the release's folder first): a log written by SGLang's ``configure_logger`` and start-up line,
read back to exactly what that release says sizes the cap — its floor inputs as the plugin reads them there
(SGLang's own functions from 0.5.22; capwatch's rule before, where prefill takes an all-gather) and its default
cap; for FlashInfer's servers and pplx's (SGLang's own start-up check of its cap, in every release)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from capwatch.sglang_logs.reader import read_logs

from tests.sglang.ranks import MODEL_CONFIG, START_TIMEOUT_S, sglang_python
from tests.sglang.releases import RELEASES, release_path
from tests.support import launcher

DP_ATTENTION = {"tp_size": 2, "ep_size": 2, "dp_size": 2, "enable_dp_attention": True}
CASES = {
    "dp-attention": {"server_args": DP_ATTENTION, "prefix": " DP1 TP1 EP1"},
    "chunk-and-graph": {"server_args": {**DP_ATTENTION, "chunked_prefill_size": 16384, "cuda_graph_max_bs_decode": 64,
                                        "max_running_requests": 96}, "prefix": " DP0 TP0 EP0"},
    "speculative": {"server_args": {**DP_ATTENTION, "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4,
                                    "speculative_num_steps": 3, "speculative_eagle_topk": 1}, "prefix": " DP1 TP1 EP1"},
    "pd-decode-log-ms": {"server_args": {**DP_ATTENTION, "disaggregation_mode": "decode"}, "prefix": " DP1 TP1 EP1",
                         "env": {"SGLANG_LOG_MS": "1"}},
    # pplx: SGLang's start-up check, the chunk or the decode graph batch (required_pplx_dispatch_tokens_per_rank),
    # and where it checks nothing (a decode server)
    "pplx-chunk-and-graph": {"backend": "pplx", "prefix": " DP0 TP0 EP0", "server_args": {
        **DP_ATTENTION, "chunked_prefill_size": 16, "cuda_graph_max_bs_decode": 64, "max_running_requests": 40}},
    "pplx-pd-decode": {"backend": "pplx", "prefix": " DP1 TP1 EP1", "server_args": {
        **DP_ATTENTION, "disaggregation_mode": "decode", "chunked_prefill_size": 16, "cuda_graph_max_bs_decode": 64}},
}
RUNNING = [5, 40, 17, 33]


# Each release's program is start-up work (importing sglang and torch), CPU-bound: two at a time.
PARALLEL_RELEASES = 2


@pytest.fixture(scope="module")
def release_logs(tmp_path_factory) -> dict:
    """release -> (its logs' folder, what that release says sizes each case's cap)."""
    with ThreadPoolExecutor(PARALLEL_RELEASES) as pool:
        return dict(zip(RELEASES, pool.map(lambda release: _write_logs(release, tmp_path_factory), RELEASES)))


def _write_logs(release: str, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"sglang-{release}-logs")
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    cases = {name: {**case, "decode": [[0, running] for running in RUNNING]} for name, case in CASES.items()}
    cases["speculative"]["server_args"] = {**cases["speculative"]["server_args"],
                                           "speculative_draft_model_path": str(model)}
    (folder / "plan.json").write_text(json.dumps({"model_dir": str(model), "cases": cases, "release": release}))
    result = launcher.run("-m", "tests.sglang.log_program", str(folder / "plan.json"), str(folder),
                         python=sglang_python(), path_first=release_path(release), imports_tests=True,
                         timeout_s=START_TIMEOUT_S * 3)
    assert result.returncode == 0, f"sglang {release}: {result.stderr[-3000:]}"
    return folder, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("release", RELEASES, ids=lambda release: f"sglang-{release}")
def test_a_log_sglang_writes_reads_to_sglangs_own_rules(release_logs, release, case):
    folder, expected = release_logs[release]
    read = read_logs([str(folder / f"{case}.log")])
    segment, = read.segments
    theirs = expected[case]
    config = segment.config
    assert config.limits.model_dump(exclude={"sglang_version"}) == {
        key: value for key, value in theirs["limits"].items() if key != "sglang_version"}
    assert config.default_cap == theirs["default_cap"] == segment.cap_in_use
    assert (config.tp_size, config.ep_size) == (theirs["tp_size"], theirs["ep_size"])
    assert config.moe_a2a_backend == CASES[case].get("backend", "flashinfer")
    assert config.tokens_per_request == theirs["limits"]["tokens_per_request"]
    assert read.decode_lines == len(RUNNING) and read.unusable_lines == read.args_unread == 0
    assert segment.history.max_peak_runtime_tokens == max(RUNNING) * config.tokens_per_request
    assert set(segment.dp_peak_tokens) == {int(CASES[case]["prefix"].split()[0][2:])}

"""SGLang 0.5.23 log lines, written with SGLang's own format strings (test and benchmark support).

Each builder below copies the f-strings of the released wheel verbatim, so a change of format in a
new release is a change here, in one place:
- the prefix: ``utils/common.py`` ``configure_logger`` (``f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"``,
  ``datefmt="%Y-%m-%d %H:%M:%S"``, ``maybe_ms = ".%(msecs)03d"`` with ``SGLANG_LOG_MS``) and the parts of
  ``prefix`` from ``managers/scheduler.py`` ``configure_scheduler_process``;
- the decode line: ``managers/scheduler_components/metrics_reporter.py`` ``report_decode_stats``, the
  pool parts from ``pool_stats_observer.py`` ``get_decode_usage_msg_parts``;
- the args line: ``entrypoints/engine.py`` (``f"server_args={_server_args_for_logging(server_args)}"``);
- the overflow: ``layers/moe/token_dispatcher/flashinfer.py``'s assertion, logged by
  ``run_scheduler_process`` as ``f"Scheduler hit an exception: {traceback}"``.

SGLang's own regex for decode lines (``debug_utils/log_parser.py``, Apache-2.0, copied verbatim as
a cross-check for the tests) is ``SGLANG_DECODE_PATTERN``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# sglang 0.5.23 python/sglang/srt/debug_utils/log_parser.py, _PATTERN_DECODE (Apache License 2.0).
SGLANG_DECODE_PATTERN = (
    r"(\(\w+ pid=(?P<pid>\d+)(?:,\s*ip=(?P<ip>[\d\.]+))?\))?\s*"
    r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})"
    r"(?:\s+DP(?P<dp_rank>\d+))?"
    r"(?:\s+TP(?P<tp_rank>\d+))?"
    r"(?:\s+EP(?P<ep_rank>\d+))?"
    r"(?:\s+PP(?P<pp_rank>\d+))?"
    r"\]\s+"
    r"Decode batch( \[\d+\])?,\s+"
    r"#running-req:\s*(?P<num_running_req>\d+),\s+"
    r"#token:\s*(?P<num_token>\d+),\s+"
    r"token usage:\s*(?P<token_usage>[0-9.]+),\s+"
    r".*?"
    r"gen throughput \(token/s\):\s*(?P<gen_throughput>[0-9.]+),\s+"
    r"#queue-req:\s*(?P<queue_req>\d+),"
)


@dataclass(frozen=True)
class Rank:
    """Which prefix parts a scheduler shows (each only when SGLang shows it)."""

    dp: int | None = None
    tp: int | None = None  # shown when tp_size > 1
    ep: int | None = None  # shown when ep_size > 1
    pp: int | None = None  # shown when pp_size > 1
    attn_cp: int | None = None
    moe_dp: int | None = None


def prefix(rank: Rank) -> str:
    """configure_scheduler_process's `prefix += f" DP{shown_dp}"` ... in its order: DP, PP, ATTN_CP, MOE_DP, TP, EP
    (each written only when SGLang shows it: here, when set)."""
    parts = (("DP", rank.dp), ("PP", rank.pp), ("ATTN_CP", rank.attn_cp), ("MOE_DP", rank.moe_dp),
             ("TP", rank.tp), ("EP", rank.ep))
    return "".join(f" {name}{value}" for name, value in parts if value is not None)


def stamp(unix_s: float, log_ms: bool = False) -> str:
    asctime = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_s))
    maybe_ms = f".{int(unix_s * 1000) % 1000:03d}" if log_ms else ""
    return f"{asctime}{maybe_ms}"


def line(unix_s: float, message: str, rank: Rank | None = None, log_ms: bool = False) -> str:
    """``f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"`` as logging renders it."""
    return f"[{stamp(unix_s, log_ms)}{prefix(rank) if rank else ''}] {message}"


def pool_parts(num_used: int, usage: float, pool: str = "full") -> list[str]:
    """get_decode_usage_msg_parts for a plain pool, hybrid SWA, hybrid SSM (mamba) or HiSparse."""
    if pool == "swa":
        return [f"#full token: {num_used}", f"full token usage: {usage:.2f}",
                f"#swa token: {num_used // 2}", f"swa token usage: {usage / 2:.2f}"]
    if pool == "mamba":
        return [f"#full token: {num_used}", f"full token usage: {usage:.2f}",
                f"mamba num: {num_used // 100}", f"mamba usage: {usage:.2f}"]
    if pool == "hisparse":
        return [f"#gpu token: {num_used}", f"gpu token usage: {usage:.2f}",
                f"#cpu token: {num_used * 4}", f"cpu token usage: {usage:.2f}"]
    return [f"#token: {num_used}, token usage: {usage:.2f}"]


def decode_message(num_running_reqs: int, *, num_used: int | None = None, usage: float = 0.05, pool: str = "full",
                   accept_length: float | None = None, accept_rate: float = 0.7, pd_decode: bool = False,
                   batch_iter: int | None = None, can_run_cuda_graph: bool = True, gen_throughput: float = 1282.5,
                   queue: int = 0, mfu: bool = False, occupancy: bool = False, graph_label: str = "cuda graph") -> str:
    """The decode message of report_decode_stats, part by part as SGLang builds it."""
    token_usage_msg = ", ".join(pool_parts(num_used if num_used is not None else num_running_reqs * 700,
                                           usage, pool)) + ", "
    iter_msg = f" [{batch_iter}]" if batch_iter is not None else ""
    msg = f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"
    if accept_length is not None:
        msg += f"accept len: {accept_length:.2f}, accept rate: {accept_rate:.2f}, "
    if pd_decode:
        msg += f"pre-allocated usage: {0.01:.2f}, "
        msg += f"#prealloc-req: {0}, "
        msg += f"#transfer-req: {1}, "
        msg += f"#retracted-req: {0}, "
    msg += (
        f"{graph_label}: {can_run_cuda_graph}, "
        f"gen throughput (token/s): {gen_throughput:.2f}, "
        f"#queue-req: {queue}"
    )
    if mfu:
        msg += (
            f", est. decode TFLOPS/s (per GPU): {12.5:.2f}, "
            f"est. read BW (GB/s per GPU): {1800.0:.2f}, "
            f"est. write BW (GB/s per GPU): {90.0:.2f}"
        )
    if occupancy:
        msg += ", " + f"fwd occupancy: {91.0:.2f}%" f", fwd+idle occupancy: {97.0:.2f}%"
    return msg


def args_message(args: dict) -> str:
    return f"server_args={args}"


def overflow_traceback(runtime_max_tokens_per_rank: int, max_num_tokens: int) -> list[str]:
    """The message run_scheduler_process logs (one record, many lines: only the first is stamped)."""
    assertion = (
        "FlashInfer A2A runtime token geometry exceeds its fixed workspace: "
        f"runtime_max_tokens_per_rank={runtime_max_tokens_per_rank} > "
        f"max_num_tokens={max_num_tokens}. Increase "
        "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK to cover the "
        "largest mixed prefill and speculative-verify batch."
    )
    return [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 6372, in run_scheduler_process',
        "    scheduler.run_event_loop()",
        '  File "/sgl/python/sglang/srt/layers/moe/token_dispatcher/flashinfer.py", line 512, in dispatch',
        "    assert runtime_max_tokens_per_rank <= self.max_num_tokens, (",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f"AssertionError: {assertion}",
        "",
    ]


def server_args(*, model_path: str = "deepseek-ai/DeepSeek-V3", tp_size: int = 8, ep_size: int = 8,
                attn_dp_size: int = 8, chunked_prefill_size: int = 8192, decode_max_bs: int = 256,
                prefill_backend: str = "breakable", prefill_max_bs: int | None = None,
                decode_backend: str = "full", disaggregation_mode: str = "null",
                speculative_algorithm: str | None = None, speculative_num_draft_tokens: int | None = None,
                speculative_num_steps: int | None = None, max_running_requests: int | None = None,
                decode_log_interval: int = 40, kv_cache_dtype: str = "auto", **extra) -> dict:
    """A resolved_dict() as 0.5.23 logs it: all 542 fields (their declared defaults, read from the wheel:
    data/sglang-0.5.23-server-args-defaults.json), the resolved values given here on top, and
    cuda_graph_config as a nested dict (_plain of the CudaGraphConfig dataclass)."""
    def phase(backend: str, max_bs: int | None) -> dict:
        return {"backend": backend, "max_bs": max_bs, "bs": None, "tc_compiler": "eager", "max_context_size": None,
                "full_prefill_max_req": None, "full_prefill_prefix_chunk_tokens": None, "max_seq_len": None}

    args = dict(_declared_defaults())
    args.update({
        "model_path": model_path, "tokenizer_path": model_path, "tokenizer_mode": "auto", "skip_tokenizer_init": False,
        "load_format": "auto", "trust_remote_code": True, "context_length": None, "host": "127.0.0.1", "port": 30000,
        "dtype": "auto", "kv_cache_dtype": kv_cache_dtype, "mem_fraction_static": 0.82,
        "max_running_requests": max_running_requests, "max_queued_requests": None, "max_total_tokens": None,
        "chunked_prefill_size": chunked_prefill_size, "enable_dynamic_chunking": False, "max_prefill_tokens": 16384,
        "schedule_policy": "fcfs", "schedule_conservativeness": 1.0, "page_size": 1, "tp_size": tp_size,
        "pp_size": 1, "dp_size": 1, "attn_dp_size": attn_dp_size, "enable_dp_attention": attn_dp_size > 1,
        "ep_size": ep_size, "moe_a2a_backend": "flashinfer", "moe_runner_backend": "flashinfer_cutlass",
        "disaggregation_mode": disaggregation_mode, "disaggregation_transfer_backend": "mooncake",
        "speculative_algorithm": speculative_algorithm, "speculative_draft_model_path": None,
        "speculative_num_steps": speculative_num_steps, "speculative_eagle_topk": 1 if speculative_algorithm else None,
        "speculative_num_draft_tokens": speculative_num_draft_tokens,
        "cuda_graph_config": {"decode": phase(decode_backend, decode_max_bs), "prefill": phase(prefill_backend, prefill_max_bs)},
        "cuda_graph_backend_decode": None, "cuda_graph_backend_prefill": None, "cuda_graph_max_bs_decode": None,
        "cuda_graph_max_bs_prefill": None, "cuda_graph_bs_decode": None, "disable_cuda_graph": False,
        "decode_log_interval": decode_log_interval, "enable_metrics": False, "log_level": "info",
        "watchdog_timeout": 300.0, "random_seed": 42, "served_model_name": model_path, "api_key": None,
        "json_model_override_args": "{}", "lora_paths": None, "cuda_graph_prefill_max_context": None,
    })
    args.update(extra)
    return args


@lru_cache(maxsize=1)
def _declared_defaults() -> dict:
    path = Path(__file__).with_name("data") / "sglang-0.5.23-server-args-defaults.json"
    return json.loads(path.read_text())["fields"]

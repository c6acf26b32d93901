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

import ast
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
                   queue: int = 0, mfu: bool = False, occupancy: bool = False, graph_label: str = "cuda graph",
                   shape: str = "comma") -> str:
    """The decode message of report_decode_stats, part by part as SGLang builds it (``shape``: "comma",
    0.5.4+; "dot", 0.3.x-0.5.3's ``log_decode_stats``; "dot-iter")."""
    token_usage_msg = ", ".join(pool_parts(num_used if num_used is not None else num_running_reqs * 700,
                                           usage, pool)) + ", "
    if shape == "dot":  # until about October 2025 (0.3.x-0.5.3): f"Decode batch. " f"#running-req: ..."
        msg = f"Decode batch. #running-req: {num_running_reqs}, {token_usage_msg}"
    elif shape == "dot-iter":  # the mid-2025 shape the issue reports
        msg = f"Decode batch. iter: {batch_iter or 0}, #running-req: {num_running_reqs}, {token_usage_msg}"
    else:
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


def overflow_traceback(runtime_max_tokens_per_rank: int, max_num_tokens: int, form: str = "geometry",
                       local_tokens: int | None = None) -> list[str]:
    """The message run_scheduler_process logs (one record, many lines: only the first is stamped). ``form``:
    "geometry" (SGLang 0.5.19+ flashinfer.py's assert), "flashinfer" (FlashInfer's own bare assert in
    MoeAlltoAll.dispatch, what 0.5.13-0.5.18 show), "recv" (0.5.16+: the local batch overran R)."""
    if form == "flashinfer":
        source = ("/usr/lib/python3/dist-packages/flashinfer/comm/trtllm_moe_alltoall.py", 1192,
                  "    assert runtime_max_tokens_per_rank <= self.max_num_tokens, (")
        assertion = "runtime_max_tokens_per_rank exceeds max_num_tokens"
    elif form == "recv":
        source = ("/sgl/python/sglang/srt/layers/moe/token_dispatcher/flashinfer.py", 260,
                  "    assert self.runtime_max_tokens_per_rank >= x.shape[0], (")
        assertion = (f"runtime_max_tokens_per_rank={runtime_max_tokens_per_rank} < "
                     f"x.shape[0]={local_tokens}: MoeAlltoAll recv buffer would overflow.")
    else:
        source = ("/sgl/python/sglang/srt/layers/moe/token_dispatcher/flashinfer.py", 512,
                  "    assert runtime_max_tokens_per_rank <= self.max_num_tokens, (")
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
        f'  File "{source[0]}", line {source[1]}, in dispatch',
        source[2],
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


# Keys of 0.5.22 - 0.5.23's resolved dict that 0.5.19 - 0.5.21's lack (their own start-up lines, written by each
# released wheel in tests/sglang/test_logs.py; the only key the other way is cuda_graph_tc_compiler).
KEYS_FROM_0_5_22 = (
    "attn_dp_size", "disaggregation_decode_allocation_policy", "dsa_triton_union", "enable_cp_tp_group_sharing",
    "enable_dsa_fused_indexer", "enable_kv_cache_sharding", "enable_watermark", "qsa_indexer_dtype",
    "speculative_enable_w4a4_mxfp4_megamoe", "speculative_use_block_verification", "watermark_config",
    "watermark_context_window", "watermark_default_enabled", "watermark_enforce_all", "watermark_key",
    "watermark_key_b", "watermark_max_probability", "watermark_mixing_probability")


def server_args_0_5_21(**settings) -> dict:
    """A resolved_dict() shaped as 0.5.19 - 0.5.21 log it: ``server_args(**settings)`` without the keys those
    releases do not have, DP attention as ``dp_size`` with ``enable_dp_attention``."""
    attn_dp_size = settings.pop("attn_dp_size", 8)
    args = server_args(attn_dp_size=attn_dp_size, **settings)
    for key in KEYS_FROM_0_5_22:
        args.pop(key)
    args.update(dp_size=attn_dp_size, enable_dp_attention=attn_dp_size > 1, cuda_graph_tc_compiler=None)
    return args


@lru_cache(maxsize=1)
def _declared_defaults() -> dict:
    path = Path(__file__).with_name("data") / "sglang-0.5.23-server-args-defaults.json"
    return json.loads(path.read_text())["fields"]


def server_args_repr(release: str, **overrides) -> str:
    """``server_args=ServerArgs(...)`` as SGLang ``release`` logged it (``logger.info(f"{server_args=}")``):
    the repr recorded from that release's own ``ServerArgs`` (data/sglang-<release>-server-args-repr.txt:
    built by the released wheel's dataclass, resolved by its ``__post_init__``, for tp 2, ep 2, dp 2 with DP
    attention, the FlashInfer A2A backend, model_path renamed), with ``overrides`` spliced in as reprs at the
    places the parser (``ast``, positions only) finds them; ``decode_max_bs`` is the nested
    ``cuda_graph_config.decode.max_bs`` (0.5.14+) or ``cuda_graph_max_bs`` (0.5.13)."""
    text = (Path(__file__).with_name("data") / f"sglang-{release}-server-args-repr.txt").read_text().strip()
    call = ast.parse(text, mode="eval").body
    edits = []
    wanted = dict(overrides)
    decode_max_bs = wanted.pop("decode_max_bs", None)
    for keyword in call.keywords:
        if keyword.arg in wanted:
            edits.append((keyword.value.col_offset, keyword.value.end_col_offset, repr(wanted.pop(keyword.arg))))
        elif decode_max_bs is not None and keyword.arg == "cuda_graph_max_bs":
            edits.append((keyword.value.col_offset, keyword.value.end_col_offset, repr(decode_max_bs)))
            decode_max_bs = None
        elif decode_max_bs is not None and keyword.arg == "cuda_graph_config":
            decode = next(item.value for item in keyword.value.keywords if item.arg == "decode")
            max_bs = next(item.value for item in decode.keywords if item.arg == "max_bs")
            edits.append((max_bs.col_offset, max_bs.end_col_offset, repr(decode_max_bs)))
            decode_max_bs = None
    if wanted or decode_max_bs is not None:
        raise KeyError(f"sglang {release}'s ServerArgs has no {sorted(wanted) or ['decode_max_bs']}")
    for start, end, value in sorted(edits, reverse=True):
        text = text[:start] + value + text[end:]
    return f"server_args={text}"


# -- every log shape capwatch reads: one template each (docs/sglang-logs.md lists the same) -----------------

RUNTIME_SPLIT_BYTES = 16 * 1024  # Docker json-file and CRI split longer lines into parts
LOCAL_ZONE_S = -8 * 3600  # SGLang stamps local time; runtimes stamp UTC: here the server runs at UTC-8


def rfc3339(unix_s: float) -> str:
    nanoseconds = int(round(unix_s * 1e9)) % 1_000_000_000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s)) + f".{nanoseconds:09d}Z"


@dataclass(frozen=True)
class LogFormat:
    """One shape of SGLang log: how SGLang (or the operator's logging config) formats a record, and what
    wraps it on its way to the file."""

    name: str
    written_by: str  # the releases or settings that produce it
    example: str  # a public example of it
    shape: str = "comma"  # the decode message: "comma", "iter" ([N], forward iters), "dot", "dot-iter"
    stamp: str = "date"  # "date" (%Y-%m-%d %H:%M:%S), "ms" (SGLANG_LOG_MS), "time" (%H:%M:%S, 2024)
    layout: str = "sglang"  # "sglang" [stamp tags], "formatter" (sglang#4592's), "formatter-tags"
    wrapper: str = ""  # "", "kubectl", "cri", "docker", "ray"
    args: str = "dict"  # "dict" (resolved_dict, 0.5.19+), "repr-0.5.18", "repr-0.5.13"

    def decode(self, unix_s: float, running: int, rank: Rank | None = None, **variant) -> list[str]:
        if self.shape == "iter":
            variant.setdefault("batch_iter", int(unix_s) % 100_000)
        shape = "comma" if self.shape == "iter" else self.shape
        if shape == "dot-iter":
            variant.setdefault("batch_iter", int(unix_s) % 100_000)
        return self.record(unix_s, [decode_message(running, shape=shape, **variant)], rank)

    def start(self, unix_s: float, **args) -> list[str]:
        """The start-up args record."""
        if self.args == "dict":
            text = args_message(server_args(**args))
        else:
            text = server_args_repr(self.args.removeprefix("repr-"), **args)
        return self.record(unix_s, [text])

    def record(self, unix_s: float, message_lines: list[str], rank: Rank | None = None) -> list[str]:
        """One logging record as the file holds it: its first line formatted, the rest (a traceback) as
        they are; each physical line wrapped by the runtime (and split when long)."""
        lines = [self._formatted(unix_s, message_lines[0], rank)] + list(message_lines[1:])
        return [wrapped for line in lines for wrapped in self._wrapped(unix_s, line)]

    def _formatted(self, unix_s: float, message: str, rank: Rank | None) -> str:
        if self.stamp == "time":
            asctime = time.strftime("%H:%M:%S", time.gmtime(unix_s))
        else:
            asctime = stamp(unix_s, log_ms=self.stamp == "ms")
        tags = prefix(rank) if rank else ""
        if self.layout == "formatter":  # sglang#4592: "%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]"
            return f"{asctime} INFO 31223 [scheduler_metrics_mixin.py:222] {message}"
        if self.layout == "formatter-tags":
            return f"{asctime} INFO 31223 [{tags.strip()} scheduler_metrics_mixin.py:222] {message}".replace("[ ", "[")
        return f"[{asctime}{tags}] {message}"

    def _wrapped(self, unix_s: float, line: str) -> list[str]:
        utc = rfc3339(unix_s - LOCAL_ZONE_S)
        if self.wrapper == "kubectl":
            return [f"{utc} {line}"]
        if self.wrapper == "ray":
            return [f"(SchedulerActor pid=4242, ip=10.0.0.7) {line}"]
        if self.wrapper in ("cri", "docker"):
            data = line.encode()
            parts = [data[at:at + RUNTIME_SPLIT_BYTES].decode() for at in range(0, max(1, len(data)),
                                                                               RUNTIME_SPLIT_BYTES)] or [""]
            if self.wrapper == "cri":
                return [f"{utc} stderr {'F' if index == len(parts) - 1 else 'P'} {part}"
                        for index, part in enumerate(parts)]
            return [json.dumps({"log": part + ("\n" if index == len(parts) - 1 else ""), "stream": "stderr",
                                "time": utc}, separators=(",", ":")) for index, part in enumerate(parts)]
        return [line]


FORMATS = [
    LogFormat("sglang-0.5.19+", "SGLang 0.5.19-0.5.23: server_args={...} (resolved_dict), "
              "[date time DP TP EP] prefix, 'Decode batch, #running-req'",
              "the sglang 0.5.23 wheel: entrypoints/engine.py, scheduler_components/metrics_reporter.py"),
    LogFormat("sglang-0.5.14-0.5.18", "SGLang up to 0.5.18: server_args=ServerArgs(...) (the dataclass repr, "
              "cuda_graph_config nested)", "https://github.com/sgl-project/sglang/issues/18729", args="repr-0.5.18"),
    LogFormat("sglang-0.5.13", "SGLang 0.5.13: the ServerArgs repr with the flat cuda_graph_max_bs",
              "the sglang 0.5.13 wheel: entrypoints/engine.py", args="repr-0.5.13"),
    LogFormat("log-ms", "SGLANG_LOG_MS=1: milliseconds in the stamp", "the sglang 0.5.8+ wheels: utils/common.py "
              "configure_logger", stamp="ms"),
    LogFormat("forward-iters", "SGLANG_LOG_FORWARD_ITERS=1 (0.5.8+), and every 0.5.4 line: 'Decode batch [N],'",
              "the sglang 0.5.4 wheel: scheduler_metrics_mixin.py", shape="iter"),
    LogFormat("dotted", "SGLang 0.3.4-0.5.3 (until about October 2025): 'Decode batch. #running-req'",
              "https://github.com/sgl-project/sglang/pull/3699", shape="dot", args="repr-0.5.13"),
    LogFormat("dotted-iter", "mid-2025 builds: 'Decode batch. iter: N, #running-req' (reported in capwatch #17; "
              "not in the 0.4.3-0.5.8 wheels checked)", "capwatch issue #17", shape="dot-iter", args="repr-0.5.13"),
    LogFormat("time-only-2024", "SGLang 0.2.x-0.3.0 (2024; datefmt %H:%M:%S until dates came in 0.3.4): "
              "'[13:45:10 TP0] Decode batch.', no date",
              "https://github.com/sgl-project/sglang/issues/1270", shape="dot", stamp="time", args="repr-0.5.13"),
    LogFormat("custom-formatter", "SGLANG_LOGGING_CONFIG_PATH (2025-03+) with sglang#4592's formatter: "
              "'DATE TIME LEVEL PID [file:line] message'", "https://github.com/sgl-project/sglang/pull/4592",
              layout="formatter"),
    LogFormat("custom-formatter-tags", "a logging config that shows the rank tags: "
              "'DATE TIME LEVEL PID [DP3 TP3 EP3 file:line] Decode batch.'", "capwatch issue #17",
              layout="formatter-tags", shape="dot"),
    LogFormat("kubectl-timestamps", "kubectl logs --timestamps, docker logs --timestamps: an RFC 3339 stamp (UTC) "
              "first", "https://kubernetes.io/docs/reference/kubectl/generated/kubectl_logs/", wrapper="kubectl"),
    LogFormat("cri", "containerd / CRI-O pod log files (/var/log/pods/...): 'RFC3339 stderr F|P line', lines "
              "split at 16 KiB", "https://github.com/kubernetes/design-proposals-archive/blob/main/node/"
              "kubelet-cri-logging.md", wrapper="cri"),
    LogFormat("docker-json-file", "Docker's json-file driver (/var/lib/docker/containers/*/*-json.log): one JSON "
              "record per line, split at 16 KiB", "https://docs.docker.com/engine/logging/drivers/json-file/",
              wrapper="docker"),
    LogFormat("ray", "--use-ray: '(SchedulerActor pid=N, ip=A) ' before each line",
              "https://github.com/sgl-project/sglang/pull/17684", wrapper="ray"),
]
FORMAT = {log.name: log for log in FORMATS}

"""The advisor over what SGLang logs show (``capwatch advise --sglang-log``): the latest configuration's
group samples, priced by the model the args (or ``--model``) name, advised by the service's own chain."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from capwatch.service.advisor.advice import ClusterAdvice, WhatIf
from capwatch.service.advisor.evidence import GroupConfig
from capwatch.service.advisor.policy import AdvisorPolicy
from capwatch.service.advisor.pricing import WorkspacePricing
from capwatch.service.advisor.recommend import recommend, whatif
from capwatch.service.config import Settings
from capwatch.sglang_logs.reader import LogError, LogRead, Segment, read_logs
from capwatch.sglang_logs.server_args import ServerConfig
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import model_geometry
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token


@dataclass(frozen=True)
class OfflineAdvice:
    advice: ClusterAdvice
    read: LogRead
    segment: Segment
    model: str
    group: GroupConfig
    policy: AdvisorPolicy

    def whatif(self, caps: list[int]) -> list[WhatIf]:
        return whatif(self.segment.history, self.group, caps, self.policy)


def advise_from_sglang_logs(paths: list[str], *, cap: int | None = None, model: str | None = None,
                            settings: Settings | None = None, cluster: str | None = None,
                            progress: Callable[[int], None] | None = None) -> OfflineAdvice:
    """The service's advisor and policy on what the logs show, for their latest configuration."""
    settings = settings or Settings()
    policy = settings.advisor
    read = read_logs(paths, settings.window_s, policy.half_life_s, policy.bump_factor, policy.bump_min_tokens,
                     cap=cap, progress=progress)
    if not read.segments:
        raise LogError(f"no server_args= line in {', '.join(paths)}: give the log from the server's start "
                       "(rotated files oldest first)" if read.unusable_lines else
                       f"no SGLang decode lines ('Decode batch, #running-req: ...') in {', '.join(paths)}")
    with_data = [segment for segment in read.segments if segment.history.sample_count]
    if not with_data:
        raise LogError(f"no SGLang decode lines ('Decode batch, #running-req: ...') after the server_args= line "
                       f"in {', '.join(paths)}: is it the scheduler's log at --log-level info?")
    segment = with_data[-1]
    config = segment.config
    name = model or config.model_path
    if not name:
        raise LogError("the server_args line names no model_path: pass --model NAME")
    try:
        geometry = model_geometry(name)
    except SizingError as error:
        raise LogError(f"{error} -- pass --model NAME to price the workspace" if model is None else str(error)) from None
    current = cap if cap is not None else segment.cap_seen if segment.cap_seen is not None else config.default_cap
    pricing = WorkspacePricing(config.a2a_group_size, dispatch_bytes_per_token(geometry.hidden_size, geometry.top_k),
                               combine_bytes_per_token(geometry.hidden_size))
    limits = config.limits.model_copy(update={"cap_source": "default" if cap is None and segment.cap_seen is None
                                              else "env"})
    kv = geometry.kv_cache.bytes_per_token(config.kv_cache_dtype) if geometry.kv_cache else None
    group = GroupConfig(cap=current, pricing=pricing, sglang=limits, kv_bytes_per_token=kv)
    advice = recommend(segment.history, group, policy)
    reasons = [_describe_read(read, segment, current, cap, config)] + advice.reasons
    name_of_cluster = cluster or _cluster_name(paths[0])
    generated = (segment.history.last_sample_s or 0.0) + settings.window_s
    return OfflineAdvice(ClusterAdvice(**{**advice.model_dump(), "reasons": reasons}, cluster=name_of_cluster,
                                       role="target", generated_unix_s=generated), read, segment, geometry.name,
                         group, policy)


def _cluster_name(path: str) -> str:
    stem = os.path.basename(path).split(".")[0] or "sglang"
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", stem)[:128]


def _describe_read(read: LogRead, segment: Segment, current: int, cap: int | None, config: ServerConfig) -> str:
    where = ("given with --cap" if cap is not None else
             "the max_num_tokens of the log's overflow assertions" if segment.cap_seen is not None else
             f"SGLang's default max(prefill buffer {config.limits.max_prefill_buffer_tokens}, 4096): "
             "the env var is not in the log")
    text = (f"read {read.lines:,} lines in {read.files} file(s): {segment.decode_lines:,} decode lines "
            f"({config.attn_dp_size} DP rank(s), R = #running-req x {config.tokens_per_request} token(s) per request, "
            f"one line per {config.decode_log_interval} decode steps), {segment.overflow_lines} overflow assertion(s); "
            f"the cap {current} is {where}")
    if len(read.segments) > 1:
        text += f"; advice is for the latest of {len(read.segments)} configurations (a restart with new args)"
    if read.unusable_lines:
        text += f"; {read.unusable_lines:,} unusable line(s) skipped"
    if segment.dp_peak_tokens and len(segment.dp_peak_tokens) > 1:
        hot = max(segment.dp_peak_tokens, key=segment.dp_peak_tokens.get)
        text += f"; DP rank {hot} drives the peak ({segment.dp_peak_tokens[hot]} tokens)"
    return text

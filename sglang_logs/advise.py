"""The advisor over what SGLang logs show (``capwatch advise --sglang-log``): the latest configuration's
group samples, priced by the model the args (or the flags) name, advised by the advisor's chain (as the service's), for
the cap variable of the A2A backend the server runs (its spec in ``backends/``).

Flags stand in for what the log does not say, and override what it does: ``--cap``, ``--model`` (or
``--hidden-size``/``--top-k``/``--num-experts``), ``--tokens-per-request``, ``--ep-size``,
``--a2a-backend``. A log without a start-up line is advised from the flags alone when all of the first
four are given; each missing one is named.

No advice is given from less than the logs hold without saying so: a decode or overflow line that was read
but could not be placed in time is counted and named in the reasons, and when it needed more tokens than
the advice sizes for, there is no advice at all but one error line (exit 2).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from capwatch.advisor.advice import ClusterAdvice, WhatIf
from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.group import group_config
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import recommend, whatif
from capwatch.advisor.settings import AdvisorSettings
from capwatch.backends import DEFAULT_BACKEND, SPECS, Pricing, spec_of
from capwatch.sglang_logs.log_file import LATE, STDIN, UNCONFIGURED, UNSTAMPED
from capwatch.sglang_logs.reader import LogError, LogRead, read_logs
from capwatch.sglang_logs.server_args import ServerConfig
from capwatch.sglang_logs.stamps import SECONDS_PER_DAY
from capwatch.sglang_logs.timeline import Segment
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import ModelGeometry, custom_geometry, model_geometry

NO_BACKEND = "none"  # SGLang's --moe-a2a-backend when MoE tokens move without an all-to-all


@dataclass(frozen=True)
class ServerFlags:
    """What the command line says about the server."""

    cap: int | None = None
    model: str | None = None
    hidden_size: int | None = None
    top_k: int | None = None
    num_experts: int | None = None
    tokens_per_request: int | None = None
    ep_size: int | None = None
    a2a_backend: str | None = None

    def geometry(self) -> ModelGeometry | None:
        numbers = {"--hidden-size": self.hidden_size, "--top-k": self.top_k, "--num-experts": self.num_experts}
        given = [flag for flag, value in numbers.items() if value is not None]
        if not given:
            return model_geometry(self.model) if self.model else None
        if self.model:
            raise LogError(f"--model and {', '.join(given)} both describe the model: give the preset or the "
                           "three numbers")
        missing = [flag for flag, value in numbers.items() if value is None]
        if missing:
            raise LogError(f"{', '.join(given)} without {', '.join(missing)}: a custom model needs all three")
        return custom_geometry(self.hidden_size, self.top_k, self.num_experts)

    def missing_for_decode_lines(self) -> list[str]:
        """The flags that must stand in for a start-up line, not given."""
        needed = {"--cap": self.cap, "--model (or --hidden-size, --top-k and --num-experts)":
                  self.model or self.hidden_size, "--tokens-per-request": self.tokens_per_request,
                  "--ep-size": self.ep_size}
        return [flag for flag, value in needed.items() if value is None]

    def fallback(self) -> ServerConfig | None:
        """The configuration of decode lines no start-up line describes: only when every part is given."""
        if self.missing_for_decode_lines():
            return None
        return ServerConfig(model_path=None, tp_size=self.ep_size, ep_size=self.ep_size, attn_dp_size=1,
                            moe_a2a_backend=self.a2a_backend, tokens_per_request=self.tokens_per_request,
                            limits=None, default_cap=self.cap, decode_log_interval=None)

    def configure(self, config: ServerConfig) -> ServerConfig:
        """A configuration read from the log, with what the flags say instead."""
        changes: dict = {}
        if self.tokens_per_request is not None:
            changes["tokens_per_request"] = self.tokens_per_request
            if config.limits is not None:
                changes["limits"] = config.limits.model_copy(update={"tokens_per_request": self.tokens_per_request})
        if self.ep_size is not None:
            changes["tp_size"] = changes["ep_size"] = self.ep_size
        if self.a2a_backend is not None:
            changes["moe_a2a_backend"] = self.a2a_backend
            if config.default_rule is not None:  # the default cap is the backend's
                changes["default_cap"] = config.default_rule.cap(self.a2a_backend)
        return dataclasses.replace(config, **changes) if changes else config


@dataclass(frozen=True)
class OfflineAdvice:
    advice: ClusterAdvice
    read: LogRead
    segment: Segment
    model: str
    group: GroupConfig
    policy: AdvisorPolicy
    backend: BackendCapRules

    def whatif(self, caps: list[int]) -> list[WhatIf]:
        return whatif(self.segment.history, self.group, caps, self.policy)


def advise_from_sglang_logs(paths: list[str], flags: ServerFlags = ServerFlags(), *,
                            settings: AdvisorSettings | None = None, cluster: str | None = None,
                            progress: Callable[[int], None] | None = None) -> OfflineAdvice:
    """The advisor and its policy (the service's CAPWATCH_ADVISOR__* and CAPWATCH_WINDOW_S) on what the logs show,
    for their latest configuration."""
    settings = settings or AdvisorSettings()
    policy = settings.advisor
    try:
        flag_geometry = flags.geometry()
    except SizingError as error:
        raise LogError(str(error)) from None
    read = read_logs(paths, window_s=settings.window_s, policy=policy, cap=flags.cap,
                     fallback=flags.fallback(), configure=flags.configure, progress=progress)
    segment = _latest_with_data(read, paths, flags)
    config = segment.config
    backend = _backend(config, flags, segment)
    geometry = flag_geometry or _geometry_of(config)
    try:
        policy = policy.for_backend(backend)
    except ValueError as error:
        raise LogError(str(error)) from None
    current = segment.cap_in_use
    pricing, prefill_through_cap = _pricing(backend, config, geometry, flags.ep_size or config.a2a_group_size)
    limits = None if config.limits is None else config.limits.model_copy(
        update={"cap_source": "default" if flags.cap is None and segment.cap_seen is None else "operator"})
    if limits is not None and backend.below_floor is not None:  # no release checks this backend's cap at start-up
        limits = limits.model_copy(update={"floor_rule": "capwatch"})
    kv = geometry.kv_cache.bytes_per_token(config.kv_cache_dtype) if geometry.kv_cache else None
    cap_source = "flag" if flags.cap is not None else "assertion" if segment.cap_seen is not None else "assumed"
    group = group_config(cap=current, pricing=pricing, a2a_backend=backend, prefill_dispatched=prefill_through_cap,
                         engine_limits=[limits],
                         kv_bytes_per_token=kv, cap_source=cap_source,
                         cap_at_least=segment.peak_without_assertion or None,
                         mem_fraction_static=config.mem_fraction_static, cap_set_by_known=False,
                         hidden_size=geometry.hidden_size, num_experts=geometry.num_experts, top_k=geometry.top_k)
    try:
        advice = recommend(segment.history, group, policy)
    except SizingError as error:
        raise LogError(str(error)) from None
    _refuse_if_unplaced_lines_matter(read, segment, advice.max_peak_runtime_tokens)
    hot = hot_dp_rank(segment)
    first = advice.reasons[:1] if advice.low_confidence else []  # said first (recommend.low_confidence_reason)
    reasons = (first + [_describe_read(read, segment, current, flags, backend)] + ([hot[1]] if hot else [])
               + advice.reasons[len(first):])
    if config.limits is None:
        below = backend.below_floor or "SGLang refuses to start with a cap below it"
        reasons.append("no start-up line: SGLang's start-up floor (prefill chunk, CUDA-graph batches x tokens per "
                       f"request) is unknown and not checked; {below}")
    generated = (segment.history.last_sample_s or 0.0) + settings.window_s
    fields = {**advice.model_dump(), "reasons": reasons,
              "env": backend.env_line(advice.recommended_cap) if advice.env is not None else None}
    return OfflineAdvice(ClusterAdvice(**fields, cluster=cluster or _cluster_name(paths[0]), role="target",
                                       generated_unix_s=generated), read, segment, geometry.name, group, policy,
                         backend)


def _latest_with_data(read: LogRead, paths: list[str], flags: ServerFlags) -> Segment:
    with_data = [segment for segment in read.segments if segment.history.sample_count]
    if with_data:
        return max(with_data, key=lambda segment: segment.last_unix_s)
    where = ", ".join(paths)
    unconfigured = next((item for item in read.unplaced if item.kind == UNCONFIGURED), None)
    if unconfigured is not None and unconfigured.lines:
        if read.args_unread and not read.args_lines:
            raise LogError(f"{read.examples['args'][0]}; to advise from the decode lines alone pass "
                           + ", ".join(flags.missing_for_decode_lines()))
        raise LogError(f"no server_args= line before the {unconfigured.lines:,} decode lines in {where} (rotated "
                       "away?): to advise from the decode lines alone pass "
                       + ", ".join(flags.missing_for_decode_lines()))
    others = [item for item in read.unplaced if item is not unconfigured]
    if others:
        found = others[0].highest(-math.inf, 1)
        raise LogError(f"{others[0].lines:,} decode line(s) in {where} could not be placed in time ({others[0].why}, "
                       f"e.g. {found[1] if found else '?'}); no window is left to advise on")
    if read.args_unread and not read.args_lines and read.examples.get("args"):
        raise LogError(read.examples["args"][0])
    hint = (f"; {read.unusable_lines:,} line(s) look like decode lines but do not read, e.g. "
            f"{read.examples['unusable'][0]}" if read.unusable_lines and read.examples.get("unusable") else "")
    if read.args_lines:
        raise LogError(f"no SGLang decode lines ('Decode batch, #running-req: ...') after the server_args= line in "
                       f"{where}: is it the scheduler's log at --log-level info?{hint}")
    raise LogError(f"no SGLang decode lines ('Decode batch, #running-req: ...') in {where}{hint}")


def _pricing(backend: BackendCapRules, config: ServerConfig, geometry: ModelGeometry,
             ep_size: int) -> tuple[Pricing, bool]:
    """The backend's memory per rank at any cap for this server, and whether its prefill batches meet the cap."""
    try:
        return spec_of(backend.name).settings_pricing(dict(config.a2a_params), geometry, ep_size, backend.alignment)
    except SizingError as error:
        raise LogError(str(error)) from None


def _backend(config: ServerConfig, flags: ServerFlags, segment: Segment) -> BackendCapRules:
    name = config.moe_a2a_backend
    if name is None:
        if segment.from_flags:
            return DEFAULT_BACKEND.rules  # flags alone: the one capwatch sizes, named in the reasons
        raise LogError("the server_args name no moe_a2a_backend (a release before the option): pass --a2a-backend "
                       f"({', '.join(sorted(SPECS))}) to size that backend's cap for this traffic")
    if name == NO_BACKEND:
        raise LogError(f"the server runs moe_a2a_backend={NO_BACKEND!r}: MoE tokens move without an all-to-all, so "
                       "there is no per-rank dispatch cap; pass --a2a-backend "
                       f"({', '.join(sorted(SPECS))}) to size one for this traffic")
    try:
        return spec_of(name).rules
    except SizingError as error:
        raise LogError(f"the server runs the {name!r} A2A backend: {error}; no advice") from None


def _geometry_of(config: ServerConfig) -> ModelGeometry:
    if not config.model_path:
        raise LogError("the server_args line names no model_path: pass --model NAME (or --hidden-size, --top-k "
                       "and --num-experts)")
    try:
        return model_geometry(config.model_path)
    except SizingError as error:
        raise LogError(f"{error} -- pass --model NAME, or --hidden-size, --top-k and --num-experts, to price "
                       "the workspace") from None


def _refuse_if_unplaced_lines_matter(read: LogRead, segment: Segment, peak: int) -> None:
    """Never advise below a line that was read: one that could not be placed and needed more than the
    advice's peak (in the latest configuration's time, or of unknown time) ends the command."""
    since = segment.first_start_s if segment.first_start_s is not None else -math.inf
    since_day = since // SECONDS_PER_DAY if math.isfinite(since) else -math.inf
    for unplaced in read.unplaced:
        if unplaced.kind == UNCONFIGURED and not segment.from_flags:
            continue  # before the first start: another configuration's lines
        found = unplaced.highest(since_day, segment.config.tokens_per_request)
        if found is not None and found[0] > peak:
            tokens, where = found
            what = ("give the files separately, in any order (they are merged by time), rather than one file "
                    "concatenated out of order" if unplaced.kind == LATE else
                    "fix or remove the line(s): capwatch cannot tell when they were written"
                    if unplaced.kind == UNSTAMPED else "give the start-up line, or the flags")
            raise LogError(f"{unplaced.lines:,} decode/overflow line(s) were read but could not be placed "
                           f"({unplaced.why}); one needs {tokens:,} tokens per rank, above the {peak:,} the advice "
                           f"saw, so the advice could be too low ({where}): {what}")


def _cluster_name(path: str) -> str:
    if path == STDIN:
        return "stdin"
    stem = os.path.basename(path).split(".")[0] or "sglang"
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", stem)[:128]


def _describe_read(read: LogRead, segment: Segment, current: int, flags: ServerFlags,
                   backend: BackendCapRules) -> str:
    config = segment.config
    where = ("given with --cap" if flags.cap is not None else
             "the max_num_tokens of the log's overflow assertions" if segment.cap_seen is not None else
             f"assumed: {config.default_rule.words(backend.name) if config.default_rule else 'SGLang default'}, "
             "but the env var is not in the log (pass --cap)")
    interval = (f"one line per {config.decode_log_interval} decode steps" if config.decode_log_interval
                else "decode_log_interval unknown")
    source = ("configured by flags (no start-up line)" if segment.from_flags else
              f"{segment.starts} start(s) with these args")
    text = (f"read {read.lines:,} lines in {read.files} file(s): {segment.decode_lines:,} decode lines "
            f"({config.attn_dp_size} DP rank(s), R = #running-req x {config.tokens_per_request} token(s) per request, "
            f"{interval}), {segment.overflow_lines} overflow assertion(s), {source}; {backend.name} A2A: the cap "
            f"{current} is {where}")
    if len(read.segments) > 1:
        text += f"; advice is for the latest of {len(read.segments)} configurations (a restart with new args)"
    if read.duplicate_lines:
        text += f"; {read.duplicate_lines:,} line(s) present in more than one file counted once"
    if read.undated_files:
        text += (f"; {len(read.undated_files)} file(s) with time-only stamps: days counted from each file's first "
                 "line (1970-01-01)")
    for unplaced in read.unplaced:
        found = unplaced.highest(-math.inf, config.tokens_per_request)
        text += f"; {unplaced.lines:,} line(s) not placed ({unplaced.why}, e.g. {found[1] if found else '?'})"
    if read.unusable_lines:
        text += f"; {read.unusable_lines:,} unusable line(s) skipped (e.g. {read.examples['unusable'][0]})"
    if read.args_unread:
        text += f"; {read.args_unread:,} server_args= line(s) not read (e.g. {read.examples['args'][0]})"
    if read.late_starts:
        text += f"; {read.late_starts:,} start-up line(s) older than the windows already placed ignored"
    if read.dropped_configurations:
        text += f"; {read.dropped_configurations:,} older configuration(s) let go (more than 64)"
    return text


def hot_dp_rank(segment: Segment) -> tuple[int, str] | None:
    """The DP rank that leads the group's peak, and how: the one whose batches alone reached the largest R, or else
    the one that held most windows' peak, more than half of them; a rank that leads every window included. None
    with one DP rank, or where no rank leads (the load is even)."""
    peaks, led = segment.dp_peak_tokens, segment.dp_peak_windows
    if segment.config.attn_dp_size <= 1 or not peaks:
        return None
    windows = sum(led.values())
    top = max(peaks.values())
    highest = [rank for rank, tokens in peaks.items() if tokens == top]
    most = max(sorted(led), key=led.get, default=None)
    if len(highest) == 1:
        hot = highest[0]
    elif most is not None and 2 * led[most] > windows:
        hot = most
    else:
        return None
    others = {rank: tokens for rank, tokens in peaks.items() if rank != hot}
    text = (f"DP rank {hot} drives the group's peak: its batches reached {peaks[hot]:,} tokens and it held the "
            f"peak of {led.get(hot, 0):,} of {windows:,} windows")
    if others:
        runner_up = max(sorted(others), key=others.get)
        text += f" (next: DP rank {runner_up}, {others[runner_up]:,} tokens at most in the windows it led)"
    else:
        text += (f" (no other of the {segment.config.attn_dp_size} DP ranks ever held a window's peak): the cap is "
                 "sized for this rank's load; balancing requests across DP ranks would lower it")
    return hot, text

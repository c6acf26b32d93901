"""Whether, and what, the launcher applies: one pure chain from the advice, the server's resolved shape, the
value the operator set and the overflow record, to one ``Outcome`` (the value to set, the record for the
schedulers, the one log line). Each guardrail is one step; the first that refuses ends the chain.

No SGLang here: ``launcher.py`` gathers the inputs inside SGLang's resolution and acts on the outcome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capwatch.advisor.advice import ClusterAdvice
from capwatch.advisor.floor import Floor
from capwatch.sglang_plugin.apply.advice import revision
from capwatch.sglang_plugin.apply.settings import LOWER_MEM_FRACTION, MODE, ApplySettings
from capwatch.sglang_plugin.apply.state import Overflow
from capwatch.sizing.backends import BackendCapRules

APPLIED_ACTIONS = ("raise", "lower", "hold")  # "set" is advice for a cap in use that is not known: never applied


@dataclass(frozen=True)
class Shape:
    """The server as SGLang resolved it: what the advice must have been made for."""

    rules: BackendCapRules  # the backend in use (its cap variable, range, alignment, reserve)
    ep_size: int
    floor: Floor | None  # the start-up floor from the resolved settings (advisor/floor.py deployment_floor)
    mem_fraction_static: float | None = None  # the resolved --mem-fraction-static
    gpu_memory_bytes: int | None = None  # the GPU's memory, for the fraction a DeepEP buffer's excess takes


@dataclass(frozen=True)
class Outcome:
    cap: int | None  # the value to set (None: leave the variable as it is)
    source: str  # the record's: capwatch, operator, default
    revision: int | None
    line: str
    mem_fraction_static: float | None = None  # the --mem-fraction-static to declare with the cap (its opt-in)


class Refused(Exception):
    """A guardrail's reason not to apply, in words."""


def _check_advice(settings: ApplySettings, advice: ClusterAdvice, shape: Shape, now: float) -> None:
    rules = shape.rules
    age_s = now - advice.generated_unix_s
    if age_s > settings.max_age_s:
        raise Refused(f"the advice is {age_s / 3600:.1f} h old, older than CAPWATCH_APPLY_MAX_AGE_S="
                      f"{settings.max_age_s:g} s")
    if age_s < -300:
        raise Refused(f"the advice is dated {-age_s:.0f} s in the future: this host's clock or the advice is wrong")
    if advice.action not in APPLIED_ACTIONS or advice.recommended_cap is None:
        raise Refused(f"the advice's action is {advice.action!r}, not one of {', '.join(APPLIED_ACTIONS)}")
    if not advice.cap_known:
        raise Refused("the advice does not know the cap in use (cap_known false): what it replaces is not known")
    if advice.low_confidence:
        raise Refused(f"the advice says low confidence ({advice.reasons[0] if advice.reasons else 'no reason'})")
    if not advice.confidence >= settings.min_confidence:
        raise Refused(f"the advice's confidence {advice.confidence:.2f} is below CAPWATCH_APPLY_MIN_CONFIDENCE="
                      f"{settings.min_confidence:g}")
    mismatched = [f"{what} {theirs!r} (this server: {ours!r})" for what, theirs, ours in (
        ("backend", advice.a2a_backend, rules.name), ("cap variable", advice.cap_variable, rules.cap_env_var),
        ("EP size", advice.ep_size, shape.ep_size),
        ("floor", advice.floor_cap, None if shape.floor is None else shape.floor.tokens)) if theirs != ours]
    if mismatched:
        raise Refused(f"the advice is for another deployment shape: {', '.join(mismatched)}")


def _clamp(advised: int, shape: Shape) -> tuple[int, str]:
    """The advised cap raised to the floor and to the backend's alignment; Refused above its largest."""
    rules, cap, notes = shape.rules, advised, []
    if shape.floor is not None and cap < shape.floor.tokens:
        cap = shape.floor.tokens
        notes.append(f"raised to the floor {cap}: {shape.floor.binds}")
    step = rules.required_alignment
    if cap % step:
        cap = -(-cap // step) * step
        notes.append(f"rounded up to a multiple of {step}")
    if cap > rules.max_cap_tokens:
        raise Refused(f"the advised {advised}, {'; '.join(notes)}, is {cap}, above {rules.max_cap_tokens} "
                      f"({rules.why_max or 'the backend refuses it'})")
    return cap, "; ".join(notes)


def _memory(settings: ApplySettings, advice: ClusterAdvice, cap: int, shape: Shape) -> float | None:
    """DeepEP's buffer past SGLang's flat reserve: Refused (the delta in words) unless the opt-in lowers
    --mem-fraction-static by it; returns the fraction to declare, or None where nothing changes."""
    if shape.rules.engine_reserve_bytes is None:
        return None
    if cap != advice.recommended_cap:
        raise Refused(f"the cap {cap} differs from the advised {advice.recommended_cap}, whose buffer the advice "
                      "priced: its memory against SGLang's reserve is not known")
    over = advice.over_sglang_reserve_bytes_recommended
    if over is None:
        raise Refused("the advice does not price the buffer against SGLang's reserve")
    if over == 0:
        return None
    over_gib = over / 2**30
    if not settings.lower_mem_fraction:
        raise Refused(f"at {cap} the {shape.rules.memory} takes {over_gib:.2f} GiB per rank more than SGLang's "
                      f"{shape.rules.engine_reserve_bytes / 2**30:.0f} GiB reserve; set {LOWER_MEM_FRACTION}=1 to "
                      f"apply it with --mem-fraction-static lowered by {over_gib:.2f} GiB / the GPU's memory")
    if shape.mem_fraction_static is None or not shape.gpu_memory_bytes:
        raise Refused(f"at {cap} the {shape.rules.memory} outgrows SGLang's reserve by {over_gib:.2f} GiB per rank "
                      "and this server's --mem-fraction-static or GPU memory is not known to lower it by that")
    lowered = shape.mem_fraction_static - over / shape.gpu_memory_bytes
    if not 0.05 <= lowered < shape.mem_fraction_static or not math.isfinite(lowered):
        raise Refused(f"at {cap} the {shape.rules.memory} outgrows SGLang's reserve by {over_gib:.2f} GiB per rank; "
                      f"--mem-fraction-static {shape.mem_fraction_static:g} lowered by it would be {lowered:.3f}")
    return math.floor(lowered * 1000) / 1000


def decide(settings: ApplySettings, shape: Shape, operator_value: str | None, advice: ClusterAdvice | None,
           advice_problem: str | None, overflow: Overflow | None, now: float) -> Outcome:
    """What to do with ``shape``'s cap variable at this start (``settings.mode`` is not off)."""
    variable, mode = shape.rules.cap_env_var, settings.mode
    kept_source = "operator" if operator_value is not None else "default"
    kept_cap = int_or_none(operator_value)
    stays = (f"{variable} stays {operator_value} (set by the operator)" if operator_value is not None
             else f"{variable} stays unset (SGLang's default)")
    head = f"capwatch: apply ({MODE}={mode}): "
    rev = None if advice is None else revision(advice)

    def refused(why: str) -> Outcome:
        return Outcome(None, kept_source, None, f"{head}not applied: {why}; {stays}")

    if advice is None:
        return refused(advice_problem or "no advice")
    try:
        _check_advice(settings, advice, shape, now)
        cap, clamped = _clamp(advice.recommended_cap, shape)
        if overflow is not None and cap <= overflow.cap and rev <= overflow.at_unix_s:
            raise Refused(f"a dispatcher overflowed at the applied cap {overflow.cap} (advice revision "
                          f"{overflow.revision}); no cap at or below it is applied until advice newer than that "
                          f"overflow (revision > {int(overflow.at_unix_s)}), this advice is revision {rev}")
        if operator_value is not None and mode != "override":
            raise Refused(f"the operator set {variable}={operator_value} ({MODE}=override replaces it); the advice "
                          f"revision {rev} says {cap}")
        mem_fraction = _memory(settings, advice, cap, shape)
    except Refused as why:
        return refused(str(why))
    because = f"{advice.action} ({'; '.join(filter(None, [clamped, advice.reasons[0] if advice.reasons else '']))})"
    memory = "" if mem_fraction is None else \
        f"; --mem-fraction-static {shape.mem_fraction_static:g} -> {mem_fraction:g} ({LOWER_MEM_FRACTION}=1)"
    replaced = "" if operator_value is None else f", replacing the operator's {operator_value}"
    if not settings.applies:
        return Outcome(None, kept_source, None, f"{head}would set {variable}={cap} from advice revision {rev}"
                                                f"{replaced}: {because}{memory}; nothing changed")
    if kept_cap == cap and operator_value is not None:
        replaced = " (the operator's value too)"
    return Outcome(cap, "capwatch", rev, f"{head}set {variable}={cap} from advice revision {rev}{replaced}: "
                                         f"{because}{memory}", mem_fraction)


def int_or_none(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None

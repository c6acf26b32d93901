"""The lines the reader uses, in every shape SGLang has written them, whatever precedes them.

- decode lines, one per DP rank every ``decode_log_interval`` steps: ``Decode batch, #running-req: N, ...``
  (0.5.x from late 2025), ``Decode batch [iter], ...`` (``SGLANG_LOG_FORWARD_ITERS``), ``Decode batch.
  #running-req: N, ...`` (until about October 2025) and ``Decode batch. iter: N, #running-req: ...``;
- overflow assertions: ``runtime_max_tokens_per_rank=R > max_num_tokens=C`` (SGLang 0.5.19+, the cap in
  use is C), FlashInfer's bare ``runtime_max_tokens_per_rank exceeds max_num_tokens`` (0.5.13-0.5.18, no
  numbers), ``runtime_max_tokens_per_rank=R < x.shape[0]=N: MoeAlltoAll recv buffer would overflow``
  (0.5.16+, the local batch N overran R), and a dispatcher's own check of the rank's batch, ``num_tokens (N)
  exceeds num_max_dispatch_tokens_per_rank (C); raise <its variable> ...`` (0.5.19+ ``token_dispatcher/pplx.py``
  ``dispatch_a`` and ``combine_a``: the batch N against the cap C);
- the start-up args line, ``server_args=`` (read by ``server_args.py``).

A decode line is read as ``<anything> <stamp> <anything> Decode batch...``: the stamp is the last one
before the message (SGLang's own, inside a runtime's wrapper), the rank tags (``DP3 TP3 EP3``) are
whatever stands between it and the message, in SGLang's bracket or a custom formatter's. The general
parser (``parse_decode_line``) reads one line at a time and learns the line's *template*: what precedes
the stamp and what stands between it and the message, generalised (digits, words, bracketed and
parenthesised groups). A template compiles to one pattern that reads a whole chunk of such lines at C
speed (``fast_pattern``); the reader uses it wherever it accounts for every decode line of a chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from capwatch.backends import SPECS
from capwatch.sglang_logs.server_args import ARGS_MARK
from capwatch.sglang_logs.stamps import STAMP, nearest_day, stamp_unix_s

DECODE_MARK = "Decode batch"
OVERFLOW_MARK = "runtime_max_tokens_per_rank"
LOCAL_BATCH_OVERFLOW_MARK = "exceeds num_max_dispatch_tokens_per_rank"
OVERFLOW_MARKS = (OVERFLOW_MARK, LOCAL_BATCH_OVERFLOW_MARK)  # a line with either may be an overflow assertion
# Every shape of the message's start, up to the number of running requests.
_MESSAGE = r"Decode batch(?: \[\d+\])?(?:,|\.(?: iter: \d+,)?) #running-req: "
_DECODE_MESSAGE = re.compile(_MESSAGE + r"(\d+),")
MAX_RUNNING_DIGITS = 7  # 10 million running requests on one rank: anything longer is not a count
_DOCKER_TIME = re.compile(r'"time":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)')
_DP = re.compile(r"(?<![A-Za-z_])DP(\d{1,6})(?!\w)")
_MAX_TEMPLATE_CHARS = 256  # a prefix longer than this is no log formatter's

# SGLang's overflow assertion, after the words a backend's dispatcher puts before it (its spec's).
_PREFIXES = "|".join(re.escape(spec.overflow_assertion_prefix) for spec in SPECS.values()
                     if spec.overflow_assertion_prefix)
_OVERFLOW = re.compile(
    r"AssertionError: " + (f"(?:{_PREFIXES})?" if _PREFIXES else "") +
    r"runtime_max_tokens_per_rank(?:=(\d{1,10}) > max_num_tokens=(\d{1,10})(?!\d)| exceeds max_num_tokens"
    r"|=(\d{1,10}) < x\.shape\[0\]=(\d{1,10})(?!\d))")
# A dispatcher's check of the rank's own batch against its cap, the variable to raise named after it.
_LOCAL_BATCH_OVERFLOW = re.compile(
    r"AssertionError: num_tokens \((\d{1,10})\) exceeds num_max_dispatch_tokens_per_rank \((\d{1,10})\); raise "
    r"[A-Z][A-Z0-9_]{0,99}")


@dataclass(frozen=True)
class Template:
    """What surrounds the stamp on a decode line, as patterns: ``before`` it, and ``between`` it and the
    message (None: SGLang's own bracket, ``[stamp tags] ``)."""

    before: str
    dated: bool
    between: str | None


@dataclass(frozen=True)
class DecodeLine:
    day: int | None  # days since 1970-01-01; None: a time-only stamp with no date on the line
    second: int  # of the day
    tags: str  # what stands between the stamp and the message (rank tags among it)
    running: int
    identity_start: int  # the line from here on identifies it across files
    template: Template | None  # None: no fast pattern reads this shape


class Overflow(NamedTuple):
    needed: int | None  # tokens per rank the step needed (None: FlashInfer's bare assertion says no number)
    cap: int | None  # the cap in use, when the message says it


class Unstamped(NamedTuple):
    why: str
    running: int


NOT_OVERFLOW = "not an overflow assertion"


def parse_decode_line(raw: str) -> DecodeLine | Unstamped | str:
    """One decode line; an ``Unstamped`` one (its number read, its time not); or why it cannot be used."""
    message = _DECODE_MESSAGE.search(raw)
    if message is None:
        return "'Decode batch' without a readable '#running-req: N,'"
    digits = message.group(1)
    if len(digits) > MAX_RUNNING_DIGITS:
        return f"#running-req has {len(digits):,} digits: not a count"
    prefix = raw[:message.start()]
    stamps = list(STAMP.finditer(prefix))
    if not stamps:
        return Unstamped("no timestamp before the message", int(digits))
    last = stamps[-1]
    day, second = stamp_unix_s(last)
    if second is None:
        return Unstamped(f"the timestamp {last.group(0)!r} is not a real time", int(digits))
    template = _template(prefix[:last.start()], last.group(1) is not None, prefix[last.end():])
    if day is None:  # time only: a wrapper's dated stamp, before the line or after it (Docker's "time"), dates it
        dated = next((stamp for stamp in reversed(stamps[:-1]) if stamp.group(1)), None)
        if dated is None:
            docker = _DOCKER_TIME.search(raw, message.end())
            dated = STAMP.match(docker.group(1).replace("T", " ")) if docker else None
        if dated is not None:
            wrapper_day, wrapper_second = stamp_unix_s(dated)
            if wrapper_day is not None and wrapper_second is not None:
                day = nearest_day(second, wrapper_day * 86_400 + wrapper_second)
                template = None  # two stamps to combine: no single-pattern shape
    return DecodeLine(day, second, prefix[last.end():], int(digits), last.start(), template)


def _template(before: str, dated: bool, between: str) -> Template | None:
    if len(before) > _MAX_TEMPLATE_CHARS or len(between) > _MAX_TEMPLATE_CHARS:
        return None
    if before.endswith("[") and re.fullmatch(r"[^\[\]\n]*\] ", between):  # SGLang's own "[stamp tags] "
        # whatever wraps it (a runtime's stamp, Docker's '{"log":"', a Ray actor) holds no '[': skip to it
        wrapper = r"\[" if before == "[" else r"[^\[\n]*\[" if "[" not in before[:-1] else _generalize(before)
        return Template(wrapper, dated, None)
    return Template(_generalize(before), dated, _generalize(between))


_TOKENS = re.compile(r"\[[^\[\]\n]*\]|\([^()\n]*\)|\d+|[A-Za-z_]+|[ \t]+|.", re.S)


def _generalize(text: str) -> str:
    """A pattern for text of this shape: digits, words, spaces, bracketed and parenthesised groups stand for
    any of their kind; other characters for themselves."""
    parts = []
    for token in _TOKENS.findall(text):
        first = token[0]
        if first == "[" and len(token) > 1:
            parts.append(r"\[[^\]\n]*\]")
        elif first == "(" and len(token) > 1:
            parts.append(r"\([^)\n]*\)")
        elif first.isdigit():
            parts.append(r"\d+")
        elif first.isalpha() or first == "_":
            parts.append(r"[A-Za-z_]+")
        elif first in " \t":
            parts.append(r"[ \t]+")
        else:
            parts.append(re.escape(token))
    return "".join(parts)


@lru_cache(maxsize=64)
def fast_pattern(template: Template, by_second: bool, identity: bool) -> re.Pattern[bytes]:
    """One pattern over a chunk (each line after a newline) for lines of this template. Groups:
    ``(window key, #running-req)``, with the line from its stamp on first when ``identity``. The window key
    is ``YYYY-MM-DD HH:MM`` (``:SS`` with ``by_second``), without the date for time-only stamps. (The tags
    are not captured: only the line with a window's peak needs them, ``peak_line_tags`` finds them.) It reads
    bytes, undecoded."""
    key = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d" if template.dated else r"\d\d:\d\d"
    seconds = r":\d\d"
    if by_second:
        key, seconds = key + seconds, ""
    tags = r"[^\]\n]*\] " if template.between is None else template.between
    # Loose where the general parser is strict (the fraction and zone, the message's variants): a class
    # loop costs less than alternatives, and what it lets through still has to match the rest.
    fraction_and_zone = r"[.,0-9Z+:-]*"
    message = r"Decode batch[ .,\[\]0-9iter:]{1,24}#running-req: "
    body = f"({key}){seconds}{fraction_and_zone}{tags}{message}(\\d{{1,{MAX_RUNNING_DIGITS}}}),"
    if identity:
        body = f"({body}[^\\n]*)"
    return re.compile(("\n" + template.before + body).encode())


def peak_line_tags(text: bytes, start: int, end: int, key: bytes, running: int) -> tuple[str, int]:
    """(the tags, the position) of the first decode line in ``text[start:end]`` whose window key is ``key`` and
    whose #running-req is ``running``: the line a fast pattern found a window's peak in. ("", start) if none."""
    needle = f"#running-req: {running},".encode()
    mark = DECODE_MARK.encode()
    at = text.find(key, start, end)
    while at >= 0:
        hit = text.find(needle, at, end)
        if hit < 0:
            break
        line_start = text.rfind(b"\n", 0, hit) + 1
        message = text.find(mark, line_start, hit)
        if message >= 0 and text.find(key, line_start, message) >= 0:
            prefix = text[line_start:message].decode("utf-8", "replace")
            stamps = list(STAMP.finditer(prefix))
            return (prefix[stamps[-1].end():] if stamps else ""), line_start
        at = hit + len(needle)
    return "", start


def dp_rank(tags: str) -> int:
    """The DP rank a line's tags name (SGLang writes ``DP{d}`` when dp_size > 1), else 0."""
    found = _DP.search(tags)
    return int(found.group(1)) if found else 0


def parse_overflow(text: str) -> Overflow | str:
    """An overflow assertion; ``NOT_OVERFLOW`` for other lines naming the variable (a traceback's source
    lines); any other text: why an assertion about it cannot be read."""
    if "AssertionError" not in text:
        return NOT_OVERFLOW
    local_batch = _LOCAL_BATCH_OVERFLOW.search(text)
    if local_batch is not None:
        return Overflow(int(local_batch.group(1)), int(local_batch.group(2)))
    found = _OVERFLOW.search(text)
    if found is None:
        mark = OVERFLOW_MARK if OVERFLOW_MARK in text else "num_max_dispatch_tokens_per_rank"
        return f"an assertion about {mark} that does not read"
    over, cap, under, local = found.groups()
    if over is not None:
        return Overflow(int(over), int(cap))
    if local is not None:
        return Overflow(max(int(local), int(under)), None)
    return Overflow(None, None)


def args_candidate(text: str) -> str | None:
    """The text after ``server_args=`` when the line is SGLang's start-up line: the mark begins the message,
    after a prefix with no quote or ``=`` in it (a logged prompt quoting the mark has them), else None."""
    at = text.find(ARGS_MARK)
    if at < 0:
        return None
    prefix = text[:at]
    if any(character in prefix for character in "'\"="):
        return None
    return text[at + len(ARGS_MARK):]

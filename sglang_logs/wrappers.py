"""What container runtimes and launchers put around SGLang's own lines, and how to take it off.

- Docker's json-file driver: ``{"log":"<line>\\n","stream":"stderr","time":"<RFC 3339>"}`` per line; a
  line longer than 16 KiB is split into records whose ``log`` lacks the final ``\\n`` (SGLang's args line is
  longer than that);
- CRI (containerd, CRI-O; the files under ``/var/log/pods``): ``<RFC 3339> <stream> <F|P> <line>``, ``P``
  for a part of a line split at 16 KiB;
- ``kubectl logs --timestamps`` / ``docker logs --timestamps``: ``<RFC 3339> <line>`` (whole lines);
- Ray actors: ``(SchedulerActor pid=N, ip=A) <line>`` (SGLang's own ``log_parser`` allows it).

Decode lines are read through these wrappers by the fast patterns (``line_shapes.py``) without taking
them off; the rare lines that need their text exactly (the args line, whose Docker-escaped quotes
matter, and the lines around an overflow) are unwrapped here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_CRI = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([FP]) ")
_TIMESTAMPS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) ")
_ACTOR = re.compile(r"\(\w+ pid=\d+(?:,\s*ip=[^)\s]{1,64})?\)\s")
DOCKER_JSON_START = '{"log":'


@dataclass(frozen=True)
class Unwrapped:
    text: str  # what SGLang (or its logging config) wrote
    outer_time: str | None = None  # the runtime's RFC 3339 stamp
    stream: str | None = None
    partial: bool = False  # the runtime split a long line: the rest follows in the next record(s)


def unwrap(raw: str) -> Unwrapped:
    """The line as SGLang wrote it, with the runtime's stamp and stream when there is a wrapper."""
    if raw.startswith(DOCKER_JSON_START):
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict) and isinstance(record.get("log"), str):
            text = record["log"]
            outer = record.get("time")
            stream = record.get("stream")
            return Unwrapped(_without_actor(text.rstrip("\r\n")), outer if isinstance(outer, str) else None,
                             stream if isinstance(stream, str) else None, not text.endswith("\n"))
    match = _CRI.match(raw)
    if match is not None:
        return Unwrapped(_without_actor(raw[match.end():]), match.group(1), match.group(2), match.group(3) == "P")
    match = _TIMESTAMPS.match(raw)
    if match is not None:
        return Unwrapped(_without_actor(raw[match.end():]), match.group(1))
    return Unwrapped(_without_actor(raw))


def _without_actor(text: str) -> str:
    match = _ACTOR.match(text)
    return text[match.end():] if match is not None else text


class LineAssembly:
    """A line a runtime split into parts (Docker json-file, CRI ``P``), joined again up to ``limit``
    characters; beyond that it is only counted (``overflowed``) until its last part."""

    def __init__(self, first: Unwrapped, limit: int) -> None:
        self.first = first
        self.parts = [first.text]
        self.size = len(first.text)
        self.limit = limit
        self.overflowed = False

    def continues_with(self, piece: Unwrapped) -> bool:
        return piece.stream == self.first.stream

    def add(self, piece: Unwrapped) -> bool:
        """Append the next part; True when the line is whole."""
        self.size += len(piece.text)
        if self.size > self.limit:
            self.overflowed = True
            self.parts = []
        elif not self.overflowed:
            self.parts.append(piece.text)
        return not piece.partial

    def text(self) -> str:
        return "".join(self.parts)

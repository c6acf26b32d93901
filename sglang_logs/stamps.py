"""Timestamps in SGLang logs: their shapes, their validation, and the window each falls in.

Shapes seen in the wild (docs/sglang-logs.md lists where each comes from):

- ``2025-11-30 12:00:00`` SGLang's own ``asctime`` (``datefmt="%Y-%m-%d %H:%M:%S"``, 2024-09 on), with
  ``.mmm`` under ``SGLANG_LOG_MS``, or ``,mmm`` from a custom formatter (``SGLANG_LOGGING_CONFIG_PATH``);
- ``2026-11-30T12:00:00.123456789Z`` a container runtime's RFC 3339 stamp (CRI, ``kubectl logs
  --timestamps``, Docker's ``"time"``), a zone or not;
- ``13:45:10`` time only: SGLang before 2024-09 (``datefmt="%H:%M:%S"``). Days are counted from the
  file's first line and roll over when the time of day goes back by more than 12 hours (midnight).

A stamp is wall-clock time; a zone suffix is not applied (SGLang's own stamp has none, and only
differences within one cluster's logs matter). A date that does not exist (month 13, day 31 of a
30-day month, year 0000), a year before 1970, or a date more than two days ahead of this machine's clock
is no stamp at all: the line is unusable, never a traceback.
"""

from __future__ import annotations

import datetime
import re
import time

SECONDS_PER_DAY = 86_400
_EPOCH_ORDINAL = 719_163  # date(1970, 1, 1).toordinal()
MIN_YEAR = 1970
_ROLLOVER_S = 12 * 3600  # a time of day this far back is the next day

# Any stamp: an optional date, a time, optional fraction and zone. The date's separator is " " or "T".
STAMP = re.compile(r"(?<![\d:.])(?:(\d{4})-(\d\d)-(\d\d)[ T])?(\d\d):(\d\d):(\d\d)(?:[.,]\d{1,9})?"
                   r"(?:Z|[+-]\d\d:?\d\d)?(?![\d:])")


def _latest_day() -> int:
    return int(time.time() // SECONDS_PER_DAY) + 2


_LATEST_DAY = _latest_day()


def day_number(year: int, month: int, day: int) -> int | None:
    """Days since 1970-01-01 of a real calendar date no later than two days from now, else None."""
    if year < MIN_YEAR:
        return None
    try:
        days = datetime.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:  # month 13, February 30, ...
        return None
    return days if days <= _LATEST_DAY else None


def second_of_day(hour: int, minute: int, second: int = 0) -> int | None:
    if hour > 23 or minute > 59 or second > 60:
        return None
    return hour * 3600 + minute * 60 + min(second, 59)  # a leap second counts in its minute


def key_seconds(key: str) -> tuple[int | None, int | None]:
    """``(day, second of day)`` of a window key: ``YYYY-MM-DD HH:MM[:SS]`` (a ``T`` may separate) or
    ``HH:MM[:SS]`` (day None). ``(None, None)`` when the stamp is not a real time."""
    try:
        if len(key) >= 16 and key[4] == "-":
            day = day_number(int(key[0:4]), int(key[5:7]), int(key[8:10]))
            if day is None:
                return None, None
            clock = key[11:]
        else:
            day, clock = None, key
        seconds = second_of_day(int(clock[0:2]), int(clock[3:5]), int(clock[6:8]) if len(clock) >= 8 else 0)
    except ValueError:
        return None, None
    return (day, seconds) if seconds is not None else (None, None)


class DayCounter:
    """The day of time-only stamps, read in file order: it rolls over when the time of day goes back by
    more than 12 hours (midnight); a time far ahead of the last one is a late line of the previous day."""

    def __init__(self) -> None:
        self.day = 0
        self._last: int | None = None

    def day_of(self, second_of_the_day: int) -> int:
        last = self._last
        if last is None:
            self._last = second_of_the_day
            return self.day
        if second_of_the_day < last - _ROLLOVER_S:
            self.day += 1
        elif second_of_the_day > last + _ROLLOVER_S:
            return self.day - 1  # late, from before midnight: the running day stays
        self._last = second_of_the_day
        return self.day


def nearest_day(second_of_the_day: int, near_unix_s: float) -> int:
    """The day on which ``second_of_the_day`` lies closest to ``near_unix_s`` (a time-only stamp dated by a
    wrapper's stamp that may be in another zone)."""
    day = int(near_unix_s // SECONDS_PER_DAY)
    return min((day - 1, day, day + 1),
               key=lambda candidate: abs(candidate * SECONDS_PER_DAY + second_of_the_day - near_unix_s))


def stamp_unix_s(match: re.Match) -> tuple[int | None, int | None]:
    """(day or None for a time-only stamp, second of day) of a ``STAMP`` match; (None, None) if not real."""
    year, month, day, hour, minute, second = match.groups()
    seconds = second_of_day(int(hour), int(minute), int(second))
    if seconds is None:
        return None, None
    if year is None:
        return None, seconds
    days = day_number(int(year), int(month), int(day))
    return (days, seconds) if days is not None else (None, None)

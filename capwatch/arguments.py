"""argparse ``type=`` converters shared by the subcommands: a bad value is one line naming what was
expected, through the CLI's one-line usage errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

Number = TypeVar("Number", int, float)

MAX_HOLD_SECONDS = 7 * 86_400


def checked(parse: Callable[[str], Number], accept: Callable[[Number], bool], what: str) -> Callable[[str], Number]:
    """A converter that parses with ``parse`` and keeps only values ``accept`` takes."""

    def convert(text: str) -> Number:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    convert.__name__ = what  # argparse names the converter in some of its own messages
    return convert


port_number = checked(int, lambda port: 1 <= port <= 65_535, "a port number in 1..65535")
port_or_zero = checked(int, lambda port: 0 <= port <= 65_535, "a port number in 0..65535 (0: any free port)")
positive_int = checked(int, lambda value: value > 0, "a positive integer")
# A wait for a service's answer: long enough for a busy one, short enough that a typo cannot hang a shell.
MAX_WAIT_SECONDS = 3600
wait_seconds = checked(float, lambda seconds: 0.1 <= seconds <= MAX_WAIT_SECONDS,
                       f"a number of seconds in 0.1..{MAX_WAIT_SECONDS}")
hold_seconds = checked(float, lambda seconds: 0 <= seconds <= MAX_HOLD_SECONDS,
                       f"a number of seconds in 0..{MAX_HOLD_SECONDS}")

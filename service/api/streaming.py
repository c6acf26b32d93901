"""Answers built from pieces the service already holds (each group's serialised summary, its rendered metric
lines), handed to the client a bounded piece at a time: a request keeps references to the pieces, never a copy
of the whole answer, so a client that reads slowly (or not at all: ``capwatch.service.http_server`` drops it)
costs the service at most one piece."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

PIECE_BYTES = 16 * 1024


async def joined(pieces: Iterable[bytes], separator: bytes = b"", start: bytes = b"",
                 end: bytes = b"") -> AsyncIterator[bytes]:
    """``start + separator.join(pieces) + end``, yielded in pieces of about ``PIECE_BYTES``."""
    buffered, size = [start], len(start)
    for index, piece in enumerate(pieces):
        if index:
            buffered.append(separator)
            size += len(separator)
        buffered.append(piece)
        size += len(piece)
        if size >= PIECE_BYTES:
            yield b"".join(buffered)
            buffered, size = [], 0
    buffered.append(end)
    yield b"".join(buffered)


def json_array(items: list[bytes]) -> AsyncIterator[bytes]:
    """A JSON array of already serialised items."""
    return joined(items, b",", b"[", b"]")

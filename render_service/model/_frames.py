"""Length-prefixed frames over pipes, shared by the template sandbox and its child process."""

from __future__ import annotations

from typing import IO

_HEADER = 4


def read_frame(stream: IO[bytes]) -> bytes | None:
    header = stream.read(_HEADER)
    if len(header) < _HEADER:
        return None
    size = int.from_bytes(header, "big")
    payload = stream.read(size)
    return payload if len(payload) == size else None


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(len(payload).to_bytes(_HEADER, "big") + payload)
    stream.flush()

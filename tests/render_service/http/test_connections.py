"""A response's head goes out with its body (http.connections._CycleTransport): one write per
small answer, nothing reordered, nothing lost when the body is late or the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

from render_service.http import connections
from render_service.http.connections import LimitedHttpToolsProtocol, _CycleTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class RecordingTransport:
    """A transport that records each write (one write is one system call on a socket)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def writelines(self, pieces: Any) -> None:
        self.write(b"".join(pieces))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


class Protocol:
    """What _CycleTransport uses of its LimitedHttpToolsProtocol."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._cycle_transport: _CycleTransport | None = None
        self.unfinished = False

    def _body_unfinished(self) -> bool:
        return self.unfinished

    def _linger(self) -> None:
        raise AssertionError("not lingering here")


def cycle(loop: asyncio.AbstractEventLoop) -> tuple[_CycleTransport, RecordingTransport]:
    transport = RecordingTransport()
    protocol: Any = Protocol(loop)
    held = _CycleTransport(transport, protocol)  # type: ignore[arg-type]
    assert protocol._cycle_transport is held
    return held, transport


def test_the_head_and_a_small_body_are_one_write() -> None:
    async def run() -> list[bytes]:
        held, transport = cycle(asyncio.get_running_loop())
        held.write(HEAD)
        assert transport.writes == []
        assert held.get_write_buffer_size() == len(HEAD)
        held.write(b"hello")
        await asyncio.sleep(0)
        return transport.writes

    assert asyncio.run(run()) == [HEAD + b"hello"]


def test_an_empty_body_sends_the_head() -> None:
    async def run() -> list[bytes]:
        held, transport = cycle(asyncio.get_running_loop())
        held.write(HEAD)
        held.write(b"")
        return transport.writes

    assert asyncio.run(run()) == [HEAD]


def test_a_head_whose_body_is_late_goes_out_at_the_next_turn() -> None:
    async def run() -> list[list[bytes]]:
        held, transport = cycle(asyncio.get_running_loop())
        held.write(HEAD)
        before = list(transport.writes)
        await asyncio.sleep(0)
        after_turn = list(transport.writes)
        held.write(b"piece")  # a streamed body's pieces go out as they come
        await asyncio.sleep(0)
        return [before, after_turn, transport.writes]

    before, after_turn, end = asyncio.run(run())
    assert before == []
    assert after_turn == [HEAD]
    assert b"".join(end) == HEAD + b"piece"


def test_a_large_body_follows_the_head_in_order() -> None:
    body = b"x" * (connections._JOIN_BYTES + 1)

    async def run() -> list[bytes]:
        held, transport = cycle(asyncio.get_running_loop())
        held.write(HEAD)
        held.write(body)
        held.write(b"tail")
        await asyncio.sleep(0)
        return transport.writes

    assert b"".join(asyncio.run(run())) == HEAD + body + b"tail"


def test_closing_sends_what_is_held_first() -> None:
    async def run() -> RecordingTransport:
        held, transport = cycle(asyncio.get_running_loop())
        held.write(HEAD)
        held.close()
        await asyncio.sleep(0)  # the scheduled flush finds nothing left to write
        return transport

    transport = asyncio.run(run())
    assert transport.writes == [HEAD]
    assert transport.closed


def test_the_protocol_flushes_the_held_head_before_writing_itself() -> None:
    async def run() -> list[bytes]:
        transport = RecordingTransport()
        protocol: Any = Protocol(asyncio.get_running_loop())
        held = _CycleTransport(transport, protocol)  # type: ignore[arg-type]
        held.write(HEAD)
        LimitedHttpToolsProtocol._flush_held(protocol)
        transport.write(b"refusal")
        return transport.writes

    assert asyncio.run(run()) == [HEAD, b"refusal"]

"""Minimal keep-alive HTTP/1.1 clients: asyncio for the throughput workload, blocking for the rest.

The load generator shares the machine's two cores with the server under test; httpx's pool costs
about 10 ms of client CPU per request at 64 connections, which would make the client, not the
server, the bottleneck. One raw connection per simulated client costs tens of microseconds.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

import msgspec


class Connection:
    """One persistent connection that sends prebuilt POST requests and reads whole responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, base_url: str) -> Connection:
        url = urlsplit(base_url)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self._writer.write(request)
        status, headers = parse_head(await self._reader.readuntil(b"\r\n\r\n"))
        if "content-length" in headers:
            body = await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = await self._read_chunked()
        else:
            body = await self._reader.read()
        return status, body

    async def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self._reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self._reader.readline()
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readline()

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """A response head's status and its header fields (names and values lower-cased)."""
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip().lower()
    return int(lines[0].split(" ", 2)[1]), fields


def post_request(base_url: str, path: str, body: bytes) -> bytes:
    """The bytes of one keep-alive JSON POST, built once and sent many times."""
    host = urlsplit(base_url).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class ClientError(OSError):
    """The connection failed or the answer was not HTTP."""


class Reply(msgspec.Struct, frozen=True):
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class Client:
    """A blocking keep-alive client for requests timed one at a time.

    httpx spends about half a millisecond of client time per request, which a one-client wall
    time counts as if the server had spent it: that shrinks the ratio between a 2 ms and a 7 ms
    server towards 1. This client sends prebuilt bytes on one socket and reads the answer with
    a handful of calls. The same client measures both systems.
    """

    def __init__(self, base_url: str, timeout: float):
        url = urlsplit(base_url)
        self._address = (url.hostname or "127.0.0.1", url.port or 80)
        self._host = url.netloc
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._answered = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def post(self, path: str, content: bytes, headers: dict[str, str]) -> Reply:
        lines = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\n{lines}"
            f"Content-Length: {len(content)}\r\n\r\n"
        )
        request = head.encode("latin-1") + content
        reused = self._sock is not None
        try:
            return self._exchange(request)
        except (OSError, ValueError) as exc:
            self.close()
            # A kept-alive connection the server closed while idle fails before any answer
            # (end of file or a reset): send once more on a new one.
            if not (reused and isinstance(exc, ConnectionError) and not self._answered):
                raise ClientError(f"{type(exc).__name__} {exc}") from exc
        try:
            return self._exchange(request)
        except (OSError, ValueError) as exc:
            self.close()
            raise ClientError(f"{type(exc).__name__} {exc}") from exc

    def _exchange(self, request: bytes) -> Reply:
        if self._sock is None:
            self._sock = socket.create_connection(self._address, timeout=self._timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        self._answered = False
        self._sock.sendall(request)
        status, fields = parse_head(self._read_until(b"\r\n\r\n"))
        if "content-length" in fields:
            body = self._read_exactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding") == "chunked":
            body = self._read_chunked()
        else:
            body = self._read_to_close()
        if fields.get("connection") == "close":
            self.close()
        return Reply(status, body)

    def _fill(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(1 << 20)
        if not data:
            raise ConnectionAbortedError("connection closed by the server")
        self._answered = True
        self._buffer += data

    def _read_until(self, marker: bytes) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            self._fill()
        found, self._buffer = self._buffer[:end], self._buffer[end + len(marker) :]
        return found

    def _read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def _read_chunked(self) -> bytes:
        parts = []
        while size := int(self._read_until(b"\r\n").split(b";")[0], 16):
            parts.append(self._read_exactly(size))
            self._read_until(b"\r\n")
        self._read_until(b"\r\n")
        return b"".join(parts)

    def _read_to_close(self) -> bytes:
        assert self._sock is not None
        while data := self._sock.recv(1 << 20):
            self._buffer += data
        found, self._buffer = self._buffer, b""
        self.close()
        return found

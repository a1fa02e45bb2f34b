"""A minimal keep-alive HTTP/1.1 client for the throughput workload.

The load generator shares the machine's two cores with the server under test; httpx's pool costs
about 10 ms of client CPU per request at 64 connections, which would make the client, not the
server, the bottleneck. One raw connection per simulated client costs tens of microseconds.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


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
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip().lower()
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


def post_request(base_url: str, path: str, body: bytes) -> bytes:
    """The bytes of one keep-alive JSON POST, built once and sent many times."""
    host = urlsplit(base_url).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body

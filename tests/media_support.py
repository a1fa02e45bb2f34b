"""Images and a local image server (127.0.0.1, a thread) for the multimodal tests."""

from __future__ import annotations

import base64
import io
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import numpy as np
from PIL import Image


def image_bytes(
    width: int, height: int, fmt: str = "PNG", seed: int = 0, mode: str = "RGB"
) -> bytes:
    """A random-noise image of the given size, encoded."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_bomb(width: int = 40_000, height: int = 40_000) -> bytes:
    """A few hundred bytes of PNG whose header claims width x height RGB pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    # A short stream of zero rows: far less than the header promises.
    idat = zlib.compress(b"\x00" * 4096, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def truncated_jpeg() -> bytes:
    data = image_bytes(200, 150, "JPEG", seed=7)
    return data[: len(data) // 2]


def image_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}, **extra}


def chat_body(*urls: str, text: str = "Describe.", **fields: Any) -> dict[str, Any]:
    content = [image_part(u) for u in urls] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], **fields}


class MediaServer:
    """Routes: /img/<name> (registered bytes), /as-text/<name> (wrong content type),
    /loop (redirects to itself), /hop/<n>/<name> (n + 1 redirects, then the image), /slow, /big,
    /location?<target> (a redirect whose Location is <target>, URL-decoded, whatever it holds)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.hits = 0
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(
                self, status: int, body: bytes, ctype: str = "image/png", **headers: str
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                server.hits += 1
                parts = self.path.strip("/").split("/")
                if parts[0] == "img" and parts[1] in server.files:
                    self._send(200, server.files[parts[1]])
                elif parts[0] == "as-text" and parts[1] in server.files:
                    self._send(200, server.files[parts[1]], "text/plain")
                elif parts[0].startswith("location?"):
                    target = unquote(self.path.split("?", 1)[1])
                    self._send(302, b"", Location=target)
                elif parts[0] == "loop":
                    self._send(302, b"", Location="/loop")
                elif parts[0] == "hop":
                    left = int(parts[1])
                    target = f"/hop/{left - 1}/{parts[2]}" if left > 0 else f"/img/{parts[2]}"
                    self._send(302, b"", Location=target)
                elif parts[0] == "slow":
                    time.sleep(3)
                    self._send(200, b"late")
                elif parts[0] == "big":
                    self._send(200, b"\x89PNG\r\n\x1a\n" + b"\x00" * (3 * 1024 * 1024))
                else:
                    self._send(404, b"not found", "text/plain")

        return Handler

    def add(self, name: str, data: bytes) -> str:
        self.files[name] = data
        return f"{self.base}/img/{name}"


@contextmanager
def media_server() -> Iterator[MediaServer]:
    server = MediaServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        thread.join(timeout=5)

"""Getting an image's bytes: ``data:`` URLs, http(s) URLs and local files, each with limits.

HTTP fetching is async (it runs on the event loop and never blocks it) and defends the server:
connect and read timeouts plus a deadline for the whole fetch, a byte limit checked while
streaming, a redirect limit, and a refusal of loopback, private, link-local and other
non-public addresses (checked for every hop, before connecting) unless the operator allows
them. Local files are read in the media pool, only under ``--allowed-local-media-path``.
"""

from __future__ import annotations

import asyncio
import binascii
import ipaddress
import socket
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import httpx
import msgspec
import pybase64

from render_service.errors import InvalidRequest
from render_service.settings import DEFAULTS


class FetchLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What an image fetch may do (the --media-* and --max-media-* flags)."""

    timeout: float = DEFAULTS["media_fetch_timeout"]
    max_bytes: int = DEFAULTS["max_media_bytes"]
    max_redirects: int = DEFAULTS["max_media_redirects"]
    allow_private: bool = DEFAULTS["allow_private_media_urls"]
    allowed_local_path: str | None = None


class MediaError(InvalidRequest):
    """A media item that cannot be used; the message names the message and part it came from."""


_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def decode_data_url(url: str) -> bytes:
    """The payload of a base64 ``data:`` URL (the only data-URL form vLLM accepts)."""
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ValueError("malformed data URL (no comma)")
    if not header.endswith(";base64"):
        raise ValueError("only base64 data URLs are supported")
    try:
        return pybase64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError("Non-base64 digit found") from exc  # vLLM's words for every case


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _check_host(url: str, limits: FetchLimits) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"unsupported URL: {url[:100]}")
    if limits.allow_private:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            parts.hostname, port, type=socket.SOCK_STREAM
        )
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {parts.hostname!r}") from exc
    for info in infos:
        if not _is_public(str(info[4][0])):
            raise ValueError(
                f"URL host {parts.hostname!r} resolves to a non-public address {info[4][0]}; "
                "private, loopback and link-local addresses are refused "
                "(--allow-private-media-urls allows them)"
            )


async def fetch_http(url: str, limits: FetchLimits) -> bytes:
    """GET ``url`` with the limits; redirects are followed by hand so every hop is checked.

    Every failure is a ValueError (a timeout a TimeoutError): httpx's exceptions are translated
    here, its whole tree included (``InvalidURL`` is not an ``HTTPError``: httpx raises it while
    it reads a redirect's Location even with redirects off).
    """
    try:
        return await _fetch_http(url, limits)
    except httpx.TimeoutException as exc:
        raise TimeoutError("fetching the image timed out") from exc
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, httpx.CookieConflict) as exc:
        raise ValueError(f"fetching the image failed: {type(exc).__name__}") from exc


async def _fetch_http(url: str, limits: FetchLimits) -> bytes:
    timeout = httpx.Timeout(limits.timeout, connect=limits.timeout)
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        async with asyncio.timeout(limits.timeout * 3):
            for _ in range(limits.max_redirects + 1):
                await _check_host(url, limits)
                async with client.stream("GET", url) as response:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise ValueError(
                            f"fetching the image failed with HTTP {response.status_code}"
                        )
                    declared = response.headers.get("content-length")
                    if (
                        declared is not None
                        and declared.isdigit()
                        and int(declared) > limits.max_bytes
                    ):
                        raise ValueError(_too_big(limits))
                    chunks = []
                    size = 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > limits.max_bytes:
                            raise ValueError(_too_big(limits))
                        chunks.append(chunk)
                    return b"".join(chunks)
    raise ValueError(f"too many redirects (more than {limits.max_redirects})")


def _too_big(limits: FetchLimits) -> str:
    return f"the image is larger than {limits.max_bytes} bytes (--max-media-bytes)"


def read_local(url: str, limits: FetchLimits) -> bytes:
    """A ``file:`` URL, only under ``--allowed-local-media-path`` (runs in the media pool)."""
    if limits.allowed_local_path is None:
        raise ValueError("Cannot load local files without `--allowed-local-media-path`.")
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError("file URLs must not name a host")
    root = Path(limits.allowed_local_path).resolve()
    path = Path(unquote(parts.path)).resolve()
    # Messages never name server paths: the client learns only that its path was refused.
    if not path.is_relative_to(root):
        raise ValueError("The file path must be a subpath of `--allowed-local-media-path`.")
    if not path.is_file():
        raise ValueError("the local file does not exist")
    try:
        with path.open("rb") as f:
            data = f.read(limits.max_bytes + 1)
    except OSError as exc:  # its message names the path
        raise ValueError(f"the local file cannot be read ({exc.strerror})") from exc
    if len(data) > limits.max_bytes:
        raise ValueError(_too_big(limits))
    return data

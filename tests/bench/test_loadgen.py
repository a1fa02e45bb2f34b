"""The bench's blocking client against a scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from bench.loadgen import Client, ClientError

LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"
CLOSING = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbad"


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def server() -> Iterator[tuple[str, list[list[bytes]], list[bytes]]]:
    """Each accepted connection answers its requests with the next script's answers in turn;
    an exhausted script closes the connection after its last answer."""
    listener = socket.create_server(("127.0.0.1", 0))
    scripts: list[list[bytes]] = []
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                for answer in scripts.pop(0) if scripts else []:
                    request = _read_request(conn)
                    if not request:
                        break
                    seen.append(request)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", scripts, seen
    listener.close()


def test_reads_length_and_chunked_bodies_on_one_connection(server) -> None:
    url, scripts, seen = server
    scripts.append([LENGTH, CHUNKED, LENGTH])
    with Client(url, 5.0) as client:
        assert (
            client.post("/a", b'{"x":1}', {"content-type": "application/json"}).content == b"hello"
        )
        second = client.post("/b", b"", {})
        assert (second.status_code, second.content) == (201, b"abcde")
        assert client.post("/c", b"z", {}).text == "hello"
    assert len(seen) == 3
    assert seen[0].startswith(b"POST /a HTTP/1.1\r\n")
    assert b"content-type: application/json\r\n" in seen[0]
    assert seen[0].endswith(b'Content-Length: 7\r\n\r\n{"x":1}')


def test_connection_close_answer_then_a_new_connection(server) -> None:
    url, scripts, seen = server
    scripts += [[CLOSING], [LENGTH]]
    with Client(url, 5.0) as client:
        assert (client.post("/a", b"", {}).status_code, client.post("/b", b"", {}).content) == (
            400,
            b"hello",
        )
    assert len(seen) == 2


def test_an_idle_connection_the_server_closed_is_replaced_once(server) -> None:
    url, scripts, seen = server
    scripts += [[LENGTH], [LENGTH]]
    with Client(url, 5.0) as client:
        assert client.post("/a", b"", {}).content == b"hello"
        # The first script is exhausted: the server closes that connection without an answer.
        assert client.post("/b", b"", {}).content == b"hello"
    assert [r.split(b" ")[1] for r in seen] == [b"/a", b"/b"]


def test_a_new_connection_closed_without_an_answer_is_an_error(server) -> None:
    url, scripts, _ = server
    scripts.append([])
    with Client(url, 5.0) as client, pytest.raises(ClientError):
        client.post("/a", b"", {})

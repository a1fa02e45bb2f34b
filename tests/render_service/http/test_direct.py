"""The direct routes (http.direct): a request the protocol answers without an ASGI cycle gets the
same bytes, metrics and access-log line as through the ASGI app; anything but the plain case
goes the ASGI way. A real uvicorn server with the production protocol, on the embedded default
model (no ../shared), in a thread of this process so the two paths can be switched per request."""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from render_service import Renderer
from render_service.http import connections, metrics
from render_service.http.app import build_app
from render_service.http.connections import LimitedHttpToolsProtocol
from render_service.http.direct import Direct
from render_service.model.default_model import ensure_default_model
from tests.render_service.derender._streams import CHAT, FLAGS, chunk

KEY = "direct-key"
MAX_BODY = 8192
RENDER = "/v1/chat/completions/render"
DERENDER = "/v1/chat/completions/derender"
STREAMS = "/v1/chat/completions/derender/streams"
COMPLETION = "/v1/completions/render"
COMPLETION_DERENDER = "/v1/completions/derender"


class Served:
    """A running server and a count of the requests its direct routes answered."""

    def __init__(
        self,
        server: uvicorn.Server,
        port: int,
        direct: Direct,
        prompt: list[int],
        output: list[int],
    ) -> None:
        self.server = server
        self.port = port
        self.direct = direct
        self.prompt = prompt
        self.output = output
        self.direct_calls = 0
        serve = direct.serve

        async def counting(*args: Any) -> None:
            self.direct_calls += 1
            await serve(*args)

        direct.serve = counting  # type: ignore[method-assign]

    def exchange(
        self,
        raw: bytes,
        *,
        direct: bool,
        answers: int = 1,
        late: bytes = b"",
        between: Callable[[], None] | None = None,
    ) -> bytes:
        """Send ``raw`` (and ``late`` a moment later, after calling ``between``) on one new
        connection with the direct routes on or off; the ``answers`` responses as received
        (with the connection's end, ``b"<closed>"``, if it closed after them)."""
        connections.serve_directly(self.direct if direct else None)
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(raw)
            if late:
                time.sleep(0.2)
                if between is not None:
                    between()
                    time.sleep(0.1)
                with contextlib.suppress(OSError):  # a refused body may meet a closed socket
                    sock.sendall(late)
            data = read_answers(sock, answers)
            sock.settimeout(0.5)
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                closed = False
            except ConnectionResetError:
                closed = True
            return data + (b"<closed>" if closed else b"")

    def shut_down_connections(self) -> None:
        """What uvicorn does to every connection when a graceful shutdown begins."""
        open_connections = list(self.server.server_state.connections)
        done = threading.Event()

        def shut() -> None:
            for connection in open_connections:
                connection.shutdown()
            done.set()

        loop = open_connections[0].loop  # type: ignore[attr-defined]

        loop.call_soon_threadsafe(shut)
        assert done.wait(10)


def read_answers(sock: socket.socket, count: int) -> bytes:
    """``count`` whole responses (each with a Content-Length, or a 100 Continue), as bytes."""
    data = b""
    done = 0

    def more() -> bytes:
        received = sock.recv(65536)
        assert received, f"connection closed early: {data!r}"
        return received

    for _ in range(count):
        while (end := data.find(b"\r\n\r\n", done)) < 0:
            data += more()
        length = re.search(rb"\r\ncontent-length: (\d+)", data[done:end], re.I)
        assert length is not None or data[done:].startswith(b"HTTP/1.1 100 "), data
        done = end + 4 + (int(length.group(1)) if length else 0)
        while len(data) < done:
            data += more()
    return data[:done]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = ensure_default_model(tmp_path_factory.mktemp("direct-model"))
    renderer = Renderer.from_pretrained(str(model), **FLAGS, api_key=KEY, max_body_bytes=MAX_BODY)
    prompt = renderer.render_chat(CHAT).token_ids
    output = renderer.model.backend.encode("Hello there, friend.", add_special_tokens=False).ids
    app = build_app(renderer)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=LimitedHttpToolsProtocol,
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield Served(server, port, app.state.direct, prompt, output)
    finally:
        connections.serve_directly(None)
        server.should_exit = True
        thread.join(30)


def post(
    path: str,
    body: bytes,
    *,
    content_type: bytes = b"application/json",
    key: str | None = KEY,
    extra: bytes = b"x-request-id: req-1\r\n",
    version: bytes = b"HTTP/1.1",
) -> bytes:
    head = b"POST %s %s\r\nhost: test\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        path.encode(),
        version,
        content_type,
        len(body),
    )
    if key is not None:
        head += b"authorization: Bearer %s\r\n" % key.encode()
    return head + extra + b"\r\n" + body


def normal(answers: bytes) -> bytes:
    """Answers without what differs between two equal ones: the date, a derendered chunk's
    creation time (in JSON, or in one msgpack answer)."""
    answers = re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", answers)
    head, _, body = answers.partition(b"\r\n\r\n")
    if b"content-type: application/msgpack" in head:
        answers = head + b"\r\n\r\n" + msgspec.json.encode(msgspec.msgpack.decode(body))
    return re.sub(rb'"created":\d+', b'"created":0', answers)


def first_chunk(served: Served) -> dict[str, Any]:
    return {
        "stream": True,
        "generate_chunk": chunk("chatcmpl-d", served.output[:1], False),
        "prompt_token_ids": served.prompt,
        "chat_request": CHAT,
    }


def state_after_first(served: Served) -> str:
    answer = served.exchange(post(DERENDER, json.dumps(first_chunk(served)).encode()), direct=True)
    state = json.loads(answer.split(b"\r\n\r\n", 1)[1])["stream_state"]
    assert isinstance(state, str)
    return state


def case(served: Served, name: str) -> bytes:
    """The request of test case ``name``."""
    chat = json.dumps(CHAT).encode()
    if name == "render":
        return post(RENDER, chat)
    if name == "render, no request id":
        return post(RENDER, chat, extra=b"")
    if name == "render, empty messages":
        return post(RENDER, b'{"messages": []}')
    if name == "render, undecodable":
        return post(RENDER, b'{"messages": [')
    if name == "render, invalid utf-8":
        return post(RENDER, b'{"messages": [{"role": "user", "content": "\xff"}]}')
    if name == "render, text/plain":
        return post(RENDER, chat, content_type=b"text/plain")
    if name == "render, no key":
        return post(RENDER, chat, key=None)
    if name == "render, wrong key":
        return post(RENDER, chat, key="nope")
    if name == "render, too large":
        return post(RENDER, b'{"messages": [], "x": "%s"}' % (b"y" * MAX_BODY))
    if name == "render, connection close":
        return post(RENDER, chat, extra=b"connection: close\r\nx-request-id: r\r\n")
    if name == "derender, first chunk":
        return post(DERENDER, json.dumps(first_chunk(served)).encode())
    if name == "derender, lean chunk":
        body = {
            "stream": True,
            "generate_chunk": chunk("chatcmpl-d", served.output[1:2], False),
            "stream_state": state_after_first(served),
        }
        return post(DERENDER, json.dumps(body).encode())
    if name == "derender, forged state":
        body = {
            "stream": True,
            "generate_chunk": chunk("chatcmpl-d", served.output[1:2], False),
            "stream_state": "v2.forged",
        }
        return post(DERENDER, json.dumps(body).encode())
    if name == "streams, json":
        return post(STREAMS, json.dumps({"items": [first_chunk(served)]}).encode())
    if name == "streams, msgpack":
        item = first_chunk(served)
        del item["stream"]
        return post(
            STREAMS,
            msgspec.msgpack.encode({"items": [item]}),
            content_type=b"application/msgpack",
            extra=b"accept: application/msgpack\r\nx-request-id: m\r\n",
        )
    if name == "completion render":
        return post(COMPLETION, b'{"prompt": ["one", "two three"]}')
    if name == "completion render, bad prompt":
        return post(COMPLETION, b'{"prompt": 7}')
    if name == "completion derender, first chunk":
        body = {
            "stream": True,
            "generate_chunk": chunk("cmpl-d", served.output[:2], False),
            "prompt_token_ids": served.prompt,
        }
        return post(COMPLETION_DERENDER, json.dumps(body).encode())
    if name == "completion derender, batch":
        body = {"generate_responses": [chunk("cmpl-d", served.output, True)]}
        return post(COMPLETION_DERENDER, json.dumps(body).encode())
    raise AssertionError(name)


CASES = {  # name: the status it gets
    "render": 200,
    "render, no request id": 200,
    "render, empty messages": 400,
    "render, undecodable": 400,
    "render, invalid utf-8": 400,
    "render, text/plain": 400,
    "render, no key": 401,
    "render, wrong key": 401,
    "render, too large": 413,
    "render, connection close": 200,
    "derender, first chunk": 200,
    "derender, lean chunk": 200,
    "derender, forged state": 400,
    "streams, json": 200,
    "streams, msgpack": 200,
    "completion render": 200,
    "completion render, bad prompt": 400,
    "completion derender, first chunk": 200,
    "completion derender, batch": 200,
}


@pytest.mark.parametrize("name", CASES)
def test_a_direct_answer_is_the_asgi_answer(served: Served, name: str) -> None:
    raw = case(served, name)
    calls = served.direct_calls
    direct = served.exchange(raw, direct=True)
    assert served.direct_calls == calls + 1, "the plain case goes the direct way"
    through_asgi = served.exchange(raw, direct=False)
    assert served.direct_calls == calls + 1
    if name == "render, no request id":  # each minted one is new, and so the body's
        assert re.search(rb"\r\nx-request-id: [0-9a-f]{16}\r\n", direct)
        direct, through_asgi = (
            re.sub(rb'x-request-id: [0-9a-f]{16}|"request_id":"[^"]*"', b"-", a)
            for a in (direct, through_asgi)
        )
    assert normal(direct) == normal(through_asgi)
    assert direct.startswith(b"HTTP/1.1 %d " % CASES[name])
    assert b"\r\nserver: uvicorn\r\n" in direct


@pytest.mark.parametrize(
    "raw",
    [
        post(RENDER, json.dumps(CHAT).encode(), version=b"HTTP/1.0"),
        post(RENDER, json.dumps(CHAT).encode(), extra=b"expect: 100-continue\r\n"),
        post(RENDER, json.dumps(CHAT).encode(), extra=b"x-forwarded-for: 10.0.0.1\r\n"),
        post(RENDER + "?x=1", json.dumps(CHAT).encode()),
        b"POST "
        + RENDER.encode()
        + b" HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        + b"authorization: Bearer "
        + KEY.encode()
        + b"\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(json.dumps(CHAT)), json.dumps(CHAT).encode()),
    ],
    ids=["http/1.0", "expect 100-continue", "proxy header", "query string", "chunked body"],
)
def test_anything_but_the_plain_case_goes_the_asgi_way(served: Served, raw: bytes) -> None:
    calls = served.direct_calls
    answer = served.exchange(raw, direct=True, answers=2 if b"100-continue" in raw else 1)
    assert served.direct_calls == calls
    assert b" 200 OK\r\n" in answer


@pytest.mark.parametrize("name", ["render", "render, too large"])
def test_a_body_that_arrives_after_its_headers_is_answered_directly_too(
    served: Served, name: str
) -> None:
    raw = case(served, name)
    head, body = raw.split(b"\r\n\r\n", 1)
    calls = served.direct_calls
    answer = served.exchange(head + b"\r\n\r\n", direct=True, late=body)
    assert served.direct_calls == calls + 1
    through_asgi = served.exchange(head + b"\r\n\r\n", direct=False, late=body)
    assert normal(answer) == normal(through_asgi)
    # A refused body is not read: the answer goes out before it, and the connection closes.
    assert answer.endswith(b"<closed>") == (name == "render, too large")


def test_a_request_in_flight_when_shutdown_begins_is_answered_then_closed(
    served: Served,
) -> None:
    raw = case(served, "render")
    head, body = raw.split(b"\r\n\r\n", 1)
    answers = []
    for direct in (True, False):
        calls = served.direct_calls
        answers.append(
            served.exchange(
                head + b"\r\n\r\n",
                direct=direct,
                late=body,
                between=served.shut_down_connections,
            )
        )
        assert served.direct_calls == calls + direct
    assert b"\r\nconnection: close\r\n" in answers[0]
    assert answers[0].endswith(b"<closed>")
    assert normal(answers[0]) == normal(answers[1])


def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    chat = json.dumps(CHAT).encode()
    requests = [
        post(RENDER, chat, extra=b"x-request-id: one\r\n"),
        post(DERENDER, json.dumps(first_chunk(served)).encode(), extra=b"x-request-id: two\r\n"),
        post(RENDER, b'{"messages": []}', extra=b"x-request-id: three\r\n"),
        post(RENDER, chat, extra=b"x-request-id: four\r\n"),
    ]
    calls = served.direct_calls
    answers = served.exchange(b"".join(requests), direct=True, answers=4)
    assert re.findall(rb"x-request-id: (\w+)", answers) == [b"one", b"two", b"three", b"four"]
    assert re.findall(rb"HTTP/1.1 (\d+)", answers) == [b"200", b"200", b"400", b"200"]
    assert served.direct_calls > calls  # the first at least; the rest queue behind it
    one_by_one = b"".join(served.exchange(r, direct=False) for r in requests)
    assert normal(answers) == normal(one_by_one)


def samples(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    connections.serve_directly(None)
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n")
        text = read_answers(sock, 1).split(b"\r\n\r\n", 1)[1].decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_and_access_log_are_the_same_either_way(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = io.StringIO()
    monkeypatch.setattr(metrics.access_log, "stream", lines)
    raws = [case(served, "render"), case(served, "render, empty messages")]
    raws.append(case(served, "derender, first chunk"))
    watched = (
        "render_service_requests_total",
        "render_service_request_duration_seconds_count",
        "render_service_requests_in_flight",
        "render_service_rendered_tokens_total",
        "render_service_derender_chunks_total",
        "render_service_derendered_tokens_total",
    )
    moved = []
    for direct in (True, False):
        before = samples(served)
        for raw in raws:
            served.exchange(raw, direct=direct)
        after = samples(served)
        moved.append(
            {
                key: after[key] - before.get(key, 0.0)
                for key in after
                if key[0] in watched and after[key] != before.get(key, 0.0)
            }
        )
    assert moved[0] == moved[1]
    chat_ok = ("render_service_requests_total", (("endpoint", RENDER), ("method", "POST")))
    assert moved[0][(chat_ok[0], (*chat_ok[1], ("status", "200")))] == 1
    assert moved[0][("render_service_derender_chunks_total", ())] == 1
    logged = [json.loads(line) for line in lines.getvalue().splitlines()]
    logged = [line for line in logged if line["path"] != "/metrics"]
    for line in logged:
        del line["ts"], line["duration_ms"], line["client"]
    assert len(logged) == 6
    assert logged[:3] == logged[3:]
    assert [line["status"] for line in logged[:3]] == [200, 400, 200]
